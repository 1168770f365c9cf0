"""A SQLite store's tenants: the answers of their requests with ids (kept in the transaction
of their effect), the bytes their runtimes take, and their tokens and cost by minute."""

from __future__ import annotations

from ...domain.ports import TenantReply
from .commits import GroupCommit


class Tenants(GroupCommit):
    """The tenants' replies and ledgers (a layer of SqliteStore)."""

    async def reply(self, tenant: str, scope: str, request_id: str) -> TenantReply | None:
        row = self._db.execute(
            "SELECT rpc, digest, runtime_id, at FROM replies WHERE tenant = ? AND scope = ? AND request_id = ?",
            (tenant, scope, request_id),
        ).fetchone()
        return TenantReply(tenant, scope, request_id, *row) if row else None

    async def forget_replies_before(self, at: float) -> None:
        with self._writing() as db:
            db.execute("DELETE FROM replies WHERE at < ?", (at,))

    async def tenant_bytes(self, tenant: str) -> int:
        # The covering index (tenant, bytes): no runtime's row (with its definitions) is read.
        used: int = self._db.execute("SELECT coalesce(sum(bytes), 0) FROM runtimes WHERE tenant = ?", (tenant,)).fetchone()[0]
        return used

    async def add_tokens(self, tenant: str, minute: int, tokens: int, micros: int = 0) -> None:
        spent, cost = self._tokens.get((tenant, minute), (0, 0))
        self._tokens[(tenant, minute)] = (spent + tokens, cost + micros)
        self._schedule_commit()

    async def tokens_since(self, tenant: str, minute: int) -> list[tuple[int, int, int]]:
        self._before_read()
        rows = self._db.execute(
            "SELECT minute, tokens, micros FROM tenant_tokens WHERE tenant = ? AND minute >= ? ORDER BY minute", (tenant, minute)
        )
        return [(int(at), int(tokens), int(micros)) for at, tokens, micros in rows]

    async def forget_tokens_before(self, minute: int) -> None:
        self._commit()  # counts still buffered are written first: the delete sees them too
        with self._writing() as db:
            db.execute("DELETE FROM tenant_tokens WHERE minute < ?", (minute,))
