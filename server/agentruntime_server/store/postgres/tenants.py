"""A PostgreSQL store's tenants: the answers of their requests with ids (kept in the
transaction of their effect), the bytes their runtimes take, and their tokens and cost by
minute."""

from __future__ import annotations

from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ...domain.errors import RequestIdTaken
from ...domain.ports import TenantReply
from .commits import GroupCommit
from .weather import guarded


class Tenants(GroupCommit):
    """The tenants' replies and ledgers (a layer of PostgresStore)."""

    @guarded
    async def reply(self, tenant: str, scope: str, request_id: str) -> TenantReply | None:
        pool = await self.pool()
        row = await pool.fetchrow(
            "SELECT rpc, digest, runtime_id, at FROM replies WHERE tenant = $1 AND scope = $2 AND request_id = $3",
            tenant,
            scope,
            request_id,
        )
        return TenantReply(tenant, scope, request_id, *row) if row is not None else None

    @guarded
    async def forget_replies_before(self, at: float) -> None:
        pool = await self.pool()
        await pool.execute("DELETE FROM replies WHERE at < $1", at)

    async def add_tokens(self, tenant: str, minute: int, tokens: int, micros: int = 0) -> None:
        batch = self._batch()
        spent, cost = batch.tokens.get((tenant, minute), (0, 0))
        batch.tokens[(tenant, minute)] = (spent + tokens, cost + micros)

    @guarded
    async def tenant_bytes(self, tenant: str) -> int:
        # What is committed: no wait for the commit under way (a check at every Post must not
        # queue behind the group commit; the contract allows any figure from the last flush on).
        pool = await self.pool()
        used: int = await pool.fetchval("SELECT COALESCE(SUM(bytes), 0) FROM runtimes WHERE tenant = $1", tenant)
        return used

    @guarded
    async def tokens_since(self, tenant: str, minute: int) -> list[tuple[int, int, int]]:
        await self._settle()
        pool = await self.pool()
        rows = await pool.fetch(
            "SELECT minute, tokens, micros FROM tenant_tokens WHERE tenant = $1 AND minute >= $2 ORDER BY minute", tenant, minute
        )
        return [(int(at), int(tokens), int(micros)) for at, tokens, micros in rows]

    @guarded
    async def forget_tokens_before(self, minute: int) -> None:
        await self._settle()  # counts still buffered are committed first: the delete sees them too
        pool = await self.pool()
        # Replicas may run it at once: the later waits for the earlier's row locks, then finds
        # those rows gone. A commit's upsert writes the current minute, never one this deletes.
        await pool.execute("DELETE FROM tenant_tokens WHERE minute < $1", minute)


async def keep(connection: Any, reply: TenantReply | None) -> None:
    """A CreateRuntime's or DeleteRuntime's answer, in the transaction of its effect: first, so
    that the same request id from two replicas at once waits for the first to commit, then
    fails here before it changes anything."""
    if reply is None:
        return
    try:
        await connection.execute(
            "INSERT INTO replies (tenant, scope, request_id, rpc, digest, runtime_id, at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            reply.tenant,
            reply.scope,
            reply.request_id,
            reply.rpc,
            reply.digest,
            reply.runtime_id,
            reply.at,
        )
    except asyncpg.UniqueViolationError:
        raise RequestIdTaken(f"request id {reply.request_id!r} was answered already") from None
