"""A PostgreSQL store's journals: whether a runtime is there, its appends (checked, encoded
and batched at once, never awaiting once its next seq is known) and its reads (whole, or a
page after an event)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import TypeAdapter

from ...domain.errors import Fenced
from ...domain.journal import Entry
from ...domain.journal.tree import RuntimeCounts
from ...domain.ports import StoredRuntime
from ...domain.vocabulary import AgentSpec
from ..payloads import journal_rows, payload_bytes
from .commits import GroupCommit
from .statements import ENTRIES, entry
from .weather import guarded

_AGENTS = TypeAdapter(tuple[AgentSpec, ...])


class Journal(GroupCommit):
    """Each runtime's journal (a layer of PostgresStore)."""

    @guarded
    async def runtime_exists(self, runtime_id: str) -> bool:
        await self._settle()
        pool = await self.pool()
        return await pool.fetchval("SELECT 1 FROM runtimes WHERE id = $1", runtime_id) is not None

    @guarded
    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: RuntimeCounts | None = None,
    ) -> None:
        if runtime_id in self.fenced:  # refused already: nothing more it writes counts
            raise Fenced(runtime_id, self.fenced[runtime_id])
        if self._down is not None or runtime_id in self.unwritten:  # the copy appending is ahead of the store
            self._unwritten([runtime_id])
            raise self._refusal()
        if self.leasing is not None and runtime_id not in self.epochs:
            raise Fenced(runtime_id)  # this process does not own it (any more): nothing it writes counts
        epoch = self.epochs.get(runtime_id)
        if runtime_id not in self._next_seq:
            pool = await self.pool()
            async with pool.acquire() as connection:
                if await connection.fetchval("SELECT 1 FROM runtimes WHERE id = $1", runtime_id) is None:
                    raise KeyError(f"no runtime {runtime_id!r} to append to")
                last = await connection.fetchval("SELECT MAX(seq) FROM journal WHERE runtime_id = $1", runtime_id)
            if self.epochs.get(runtime_id) != epoch:
                # Lost while the seq was read (and maybe claimed again): the read may predate
                # another replica's writes, and the copy appending is not this epoch's.
                raise Fenced(runtime_id, self.fenced.get(runtime_id))
            self._next_seq.setdefault(runtime_id, (last or 0) + 1)  # another append may have come first
        # From here on no await: checked, encoded and buffered at once, all or nothing, so that
        # nothing that reaches the tick's commit can fail.
        if self._open is not None and self._open.epochs.get(runtime_id, epoch) != epoch:
            self._open.forget(runtime_id)  # a dropped copy's rows, refused anyway: one epoch a batch
        rows, self._next_seq[runtime_id] = journal_rows(runtime_id, self._next_seq[runtime_id], entries)
        batch = self._batch()
        if epoch is not None:
            batch.epochs[runtime_id] = epoch
        batch.rows.extend(rows)
        batch.grown[runtime_id] = batch.grown.get(runtime_id, 0) + payload_bytes(rows)
        if running is not None:
            batch.running[runtime_id] = running
        if counts is not None:
            batch.counts[runtime_id] = counts
        batch.touched.add(runtime_id)

    @guarded
    async def load(self, runtime_id: str) -> StoredRuntime | None:
        await self._settle()
        pool = await self.pool()
        epoch = self.epochs.get(runtime_id)  # replicas: the lease this read may speak for
        async with pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
            agents = await connection.fetchval("SELECT agents FROM runtimes WHERE id = $1", runtime_id)
            if agents is None:
                return None
            rows = await connection.fetch(ENTRIES + " ORDER BY seq", runtime_id)
        entries = [entry(*row) for row in rows]
        # Appends of this runtime follow from here without an await (two could race otherwise).
        # Replicas: only a read made under a lease held throughout knows the last seq; one of a
        # runtime another replica runs may predate that replica's last commit, and end after
        # this replica claimed the runtime (the claim forgets the seq: append reads it again).
        if self.leasing is None or (epoch is not None and self.epochs.get(runtime_id) == epoch):
            self._next_seq.setdefault(runtime_id, (entries[-1].seq if entries else 0) + 1)
        if self.leasing is None:  # no leases: what is there now is the runtime this process writes to
            self.fenced.pop(runtime_id, None)
            self.unwritten.discard(runtime_id)
        return StoredRuntime(_AGENTS.validate_json(agents), entries)

    @guarded
    async def load_until(self, runtime_id: str, upto_event: int) -> StoredRuntime | None:
        await self._settle()
        pool = await self.pool()
        async with pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
            agents = await connection.fetchval("SELECT agents FROM runtimes WHERE id = $1", runtime_id)
            if agents is None:
                return None
            rows = await connection.fetch(ENTRIES + " AND first_event <= $2 ORDER BY seq", runtime_id, upto_event)
        return StoredRuntime(_AGENTS.validate_json(agents), [entry(*row) for row in rows])

    @guarded
    async def entries_after_event(self, runtime_id: str, after_event: int, limit: int | None = None) -> list[Entry]:
        await self._settle()
        pool = await self.pool()
        if limit is None:
            rows = await pool.fetch(ENTRIES + " AND last_event > $2 ORDER BY seq", runtime_id, after_event)
        else:
            # In the order of journal_by_event (the order of seq, as a journal's last events
            # never go down): a page starts where its first row is, not at the journal's start.
            query = ENTRIES + " AND last_event > $2 ORDER BY last_event, seq LIMIT $3"
            rows = await pool.fetch(query, runtime_id, after_event, limit)
        return [entry(*row) for row in rows]
