"""A SQLite store's runtimes: their rows (created with their first steps, deleted with their
journal), the listing of a tenant's, their count, and retention's idle ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ...domain.errors import RuntimeExists
from ...domain.journal import Entry
from ...domain.journal.tree import RuntimeCounts
from ...domain.ports import Origin, RuntimeRow, TenantReply
from ...domain.vocabulary import AgentSpec
from ..payloads import definitions_json, grouped, journal_rows
from .commits import GroupCommit
from .creations import Creation, keep

_COUNT = "SELECT COUNT(*) FROM runtimes WHERE tenant = ?"
_LISTED = (
    "id, tenant, created_at, handles, running_handles, suspended_handles, tokens, cost_micros, cost_currency, cost_priced,"
    " forked_from, fork_seq"
)
# Retention's test (ports.Store.idle_runtimes): nothing running, and not written since the
# cutoff of its kind (NULL: never idle); `latest`, the later cutoff, bounds the index scan.
_IDLE = "updated_at < :latest AND running = 0 AND updated_at < CASE WHEN suspended_handles = 0 THEN :settled ELSE :suspended END"


class Runtimes(GroupCommit):
    """The runtimes' rows (a layer of SqliteStore)."""

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
        # Written by the group commit, with the steps of every runtime at work (creations.py):
        # a runtime's own transaction cost as much as a commit of theirs, one a root.
        # (An id in the file already is refused by the insert, alone: the service looked just
        # before, so only a create of the same id under way here is refused without waiting.)
        self._raise_if_cannot_write()
        if runtime_id in self._creating:
            raise RuntimeExists(runtime_id)
        groups = grouped(journal_rows(runtime_id, 1, entries)[0])
        creation = Creation(runtime_id, tenant, definitions_json(agents), time.time(), groups, reply, quota, origin)
        self._creations.append(creation)
        self._creating.add(runtime_id)
        self._schedule_commit()
        await asyncio.shield(creation.written)
        self._next_seq.pop(runtime_id, None)  # read again at its first append, from what is there now
        self.unwritten.discard(runtime_id)

    async def list_runtimes(
        self, tenant: str, after: tuple[float, str] | None, limit: int, forks_of: str = ""
    ) -> list[RuntimeRow]:
        self._before_read()
        query = (
            f"SELECT {_LISTED} FROM runtimes WHERE tenant = ?"
            + (" AND forked_from = ?" if forks_of else "")
            + (" AND (created_at < ? OR (created_at = ? AND id < ?))" if after else "")
            + " ORDER BY created_at DESC, id DESC LIMIT ?"
        )
        parameters = (
            tenant,
            *((forks_of,) if forks_of else ()),
            *((after[0], after[0], after[1]) if after else ()),
            limit,
        )
        return [_row(*row) for row in self._db.execute(query, parameters)]

    async def delete_runtime(self, runtime_id: str, reply: TenantReply | None = None) -> None:
        self._commit()
        with self._writing() as db:
            keep(db, reply)
            db.execute("DELETE FROM journal WHERE runtime_id = ?", (runtime_id,))
            db.execute("DELETE FROM runtimes WHERE id = ?", (runtime_id,))
        self._next_seq.pop(runtime_id, None)

    async def delete_if_idle(self, runtime_id: str, before: float | None, suspended_before: float | None = None) -> bool:
        cutoffs = _cutoffs(before, suspended_before)
        if cutoffs is None:
            return False
        self._commit()  # an append still buffered is a write: it moves updated_at first
        with self._writing() as db:
            deleted = db.execute(f"DELETE FROM runtimes WHERE id = :id AND {_IDLE}", {"id": runtime_id, **cutoffs}).rowcount
            if deleted:
                db.execute("DELETE FROM journal WHERE runtime_id = ?", (runtime_id,))
        if deleted:
            self._next_seq.pop(runtime_id, None)
        return bool(deleted)

    async def idle_runtimes(self, before: float | None, suspended_before: float | None = None) -> list[str]:
        cutoffs = _cutoffs(before, suspended_before)
        if cutoffs is None:
            return []
        self._before_read()
        rows = self._db.execute(f"SELECT id FROM runtimes WHERE {_IDLE} ORDER BY updated_at", cutoffs)
        return [runtime_id for (runtime_id,) in rows]

    async def count_runtimes(self, tenant: str) -> int:
        count: int = self._db.execute(_COUNT, (tenant,)).fetchone()[0]
        return count

    async def runtimes_with_running_handles(self) -> list[str]:
        self._before_read()
        return [runtime_id for (runtime_id,) in self._db.execute("SELECT id FROM runtimes WHERE running = 1 ORDER BY id")]


def _cutoffs(settled: float | None, suspended: float | None) -> dict[str, float | None] | None:
    """_IDLE's parameters; None when both kinds are kept for ever."""
    given = [cutoff for cutoff in (settled, suspended) if cutoff is not None]
    return {"latest": max(given), "settled": settled, "suspended": suspended} if given else None


def _row(runtime_id: str, tenant: str, created_at: float, *counts: object) -> RuntimeRow:
    handles, running, suspended, tokens, micros, currency, priced, forked_from, fork_seq = counts
    figures = RuntimeCounts(handles, running, suspended, tokens, micros, currency, bool(priced))  # type: ignore[arg-type]
    return RuntimeRow(runtime_id, tenant, created_at, figures, str(forked_from), int(fork_seq))  # type: ignore[call-overload]
