"""A PostgreSQL store's runtimes: their rows (created with their first steps, under the
tenant's quota; deleted with their journal), the listing of a tenant's, their count, and
retention's idle ones."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import asyncpg  # type: ignore[import-untyped]

from ...domain.errors import RuntimeExists
from ...domain.journal import Entry
from ...domain.journal.tree import NO_COUNTS, RuntimeCounts
from ...domain.ports import Origin, RuntimeRow, TenantReply
from ...domain.tenancy.quotas import runtimes_quota_reached
from ...domain.vocabulary import AgentSpec
from ..payloads import definitions_json, journal_rows, payload_bytes
from .commits import GroupCommit
from .statements import CREATE, DELETE_IF_IDLE, IDLE, QUOTA_LOCK, tenant_lock
from .tenants import keep
from .weather import guarded


class Runtimes(GroupCommit):
    """The runtimes' rows (a layer of PostgresStore)."""

    @guarded
    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        tenant: str = "default",
        entries: Sequence[Entry] = (),
        quota: int = 0,
        reply: TenantReply | None = None,
        origin: Origin | None = None,
    ) -> None:
        rows, next_seq = journal_rows(runtime_id, 1, entries)
        pool = await self.pool()
        owner = self.leasing.replica_id if self.leasing is not None else None
        definitions = definitions_json(agents)
        parameters = (
            runtime_id,
            definitions.decode(),
            time.time(),
            tenant,
            owner,  # replicas: its creator runs it first (no other replica knows it yet)
            quota,
            *([row[n] for row in rows] for n in range(6)),
            len(definitions) + payload_bytes(rows),
            origin.forked_from if origin else "",
            origin.fork_seq if origin else 0,
            *(origin.counts if origin else NO_COUNTS),
            origin.running if origin else False,
        )
        # Until its epoch is recorded below, a renewal that already reads the new row must not
        # release it as a runtime this replica no longer holds (another would then claim it
        # while this replica answers from its own copy).
        creating = self.leasing.creating(runtime_id) if self.leasing is not None else contextlib.nullcontext()
        with creating:
            try:  # its own transaction, not the group commit's: a runtime is created once, and acknowledged at once
                if not quota and reply is None:
                    created = await pool.fetchval(CREATE, *parameters)
                else:
                    async with pool.acquire() as connection, connection.transaction():
                        await keep(connection, reply)
                        # Creates of one tenant, from any process, one at a time: each counts
                        # in a statement that starts once the one before has committed (READ
                        # COMMITTED reads as of the start of a statement, so the count cannot
                        # share a statement with the wait; and without the lock, two creates
                        # at once would each count before the other's insert, and both pass).
                        if quota:
                            await connection.execute("SELECT pg_advisory_xact_lock($1, $2)", QUOTA_LOCK, tenant_lock(tenant))
                        created = await connection.fetchval(CREATE, *parameters)
                        if not created:
                            raise runtimes_quota_reached(tenant, quota)  # (and the answer kept above goes with it)
            except asyncpg.UniqueViolationError:  # created at the same moment through another connection
                raise RuntimeExists(runtime_id) from None
            if not created:
                raise runtimes_quota_reached(tenant, quota)
            self.fenced.pop(runtime_id, None)  # a runtime of this id deleted under this process: not this one
            self.unwritten.discard(runtime_id)
            if owner is not None:
                self.epochs[runtime_id] = 1
        self._next_seq[runtime_id] = next_seq  # so that append never awaits: the journal assigns seqs in order

    @guarded
    async def delete_runtime(self, runtime_id: str, reply: TenantReply | None = None) -> None:
        await self._settle()
        pool = await self.pool()
        async with pool.acquire() as connection, connection.transaction():
            await keep(connection, reply)
            # The runtime's row first: a commit that locked it first is waited for, and its rows
            # are seen by the journal's delete (a statement of its own, read after it); a
            # commit after finds no row and writes none. The other way round, a commit landing
            # between the two statements left journal rows of no runtime, under the seqs a
            # runtime created again with this id appends.
            await connection.execute("DELETE FROM runtimes WHERE id = $1", runtime_id)
            await connection.execute("DELETE FROM journal WHERE runtime_id = $1", runtime_id)
        self._next_seq.pop(runtime_id, None)
        self.epochs.pop(runtime_id, None)
        self.fenced.pop(runtime_id, None)

    @guarded
    async def list_runtimes(
        self, tenant: str, after: tuple[float, str] | None, limit: int, forks_of: str = ""
    ) -> list[RuntimeRow]:
        await self._settle()
        pool = await self.pool()
        # COLLATE "C": ids order by their bytes, as in SQLite, whatever the database's locale.
        query = (
            "SELECT id, tenant, created_at, handles, running_handles, suspended_handles, tokens, cost_micros, cost_currency,"
            " cost_priced, forked_from, fork_seq FROM runtimes WHERE tenant = $1 AND ($2::text = '' OR forked_from = $2::text)"
            + (' AND (created_at < $3 OR (created_at = $3 AND id COLLATE "C" < $4))' if after else "")
            + f' ORDER BY created_at DESC, id COLLATE "C" DESC LIMIT ${5 if after else 3}'
        )
        parameters = (tenant, forks_of, after[0], after[1], limit) if after else (tenant, forks_of, limit)
        return [
            RuntimeRow(row[0], row[1], row[2], RuntimeCounts(*row[3:10]), row[10], row[11])
            for row in await pool.fetch(query, *parameters)
        ]

    @guarded
    async def idle_runtimes(self, before: float | None, suspended_before: float | None = None) -> list[str]:
        await self._settle()
        pool = await self.pool()
        mine = self.leasing.replica_id if self.leasing is not None else ""
        query = f'SELECT r.id FROM runtimes r WHERE {IDLE} ORDER BY r.updated_at, r.id COLLATE "C"'
        rows = await pool.fetch(query, before, suspended_before, mine)
        return [row[0] for row in rows]

    @guarded
    async def delete_if_idle(self, runtime_id: str, before: float | None, suspended_before: float | None = None) -> bool:
        await self._settle()  # an append still buffered is a write: it moves updated_at first
        pool = await self.pool()
        mine = self.leasing.replica_id if self.leasing is not None else ""
        # One statement: a commit or a claim of the runtime that lands first holds its row
        # lock, and the DELETE checks the row again as that left it.
        deleted = await pool.fetchval(DELETE_IF_IDLE, before, suspended_before, mine, runtime_id)
        if deleted is None:
            return False
        self._next_seq.pop(runtime_id, None)
        self.epochs.pop(runtime_id, None)
        self.fenced.pop(runtime_id, None)
        return True

    @guarded
    async def count_runtimes(self, tenant: str) -> int:
        await self._settle()
        pool = await self.pool()
        count: int = await pool.fetchval("SELECT COUNT(*) FROM runtimes WHERE tenant = $1", tenant)
        return count

    @guarded
    async def runtimes_with_running_handles(self) -> list[str]:
        await self._settle()
        pool = await self.pool()
        return [row[0] for row in await pool.fetch('SELECT id FROM runtimes WHERE running ORDER BY id COLLATE "C"')]
