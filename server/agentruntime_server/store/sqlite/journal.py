"""A SQLite store's journals: whether a runtime is there, its appends (checked and buffered
at once, written by the group commit) and its reads (whole, or a page after an event)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import TypeAdapter

from ...domain.errors import NotJournaled
from ...domain.journal import Entry
from ...domain.journal.tree import RuntimeCounts
from ...domain.ports import StoredRuntime
from ...domain.vocabulary import AgentSpec
from ..payloads import journal_rows, ungrouped
from .commits import GroupCommit

_AGENTS = TypeAdapter(tuple[AgentSpec, ...])
_AFTER_EVENT = "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = ? AND last_event > ?"


class Journal(GroupCommit):
    """Each runtime's journal (a layer of SqliteStore)."""

    async def runtime_exists(self, runtime_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM runtimes WHERE id = ?", (runtime_id,)).fetchone() is not None

    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: RuntimeCounts | None = None,
    ) -> None:
        if self._down is not None or runtime_id in self.unwritten:  # the copy appending is ahead of the store
            self._unwritten([runtime_id])
            raise self._refusal() if self._down is not None else NotJournaled(runtime_id)
        if runtime_id not in self._next_seq:
            if not await self.runtime_exists(runtime_id):
                raise KeyError(f"no runtime {runtime_id!r} to append to")
            last = self._db.execute(
                "SELECT coalesce(last_seq, seq) FROM journal WHERE runtime_id = ? ORDER BY seq DESC LIMIT 1", (runtime_id,)
            ).fetchone()
            self._next_seq[runtime_id] = (last[0] if last else 0) + 1
        rows, self._next_seq[runtime_id] = journal_rows(runtime_id, self._next_seq[runtime_id], entries)
        # All or nothing, and checked here: a group commit writes every runtime's rows at once,
        # so nothing that reaches it may fail.
        self._rows.extend(rows)
        if running is not None:
            self._running[runtime_id] = running
        if counts is not None:
            self._counts[runtime_id] = counts
        self._touched.add(runtime_id)
        self._schedule_commit()

    async def load(self, runtime_id: str) -> StoredRuntime | None:
        self._before_read()  # reads see every entry appended so far
        row = self._db.execute("SELECT agents FROM runtimes WHERE id = ?", (runtime_id,)).fetchone()
        if row is None:
            return None
        self.unwritten.discard(runtime_id)  # this copy is what the store holds
        rows = self._db.execute(
            "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = ? ORDER BY seq", (runtime_id,)
        )
        return StoredRuntime(_AGENTS.validate_json(row[0]), [entry for values in rows for entry in ungrouped(*values)])

    async def load_until(self, runtime_id: str, upto_event: int) -> StoredRuntime | None:
        self._before_read()
        row = self._db.execute("SELECT agents FROM runtimes WHERE id = ?", (runtime_id,)).fetchone()
        if row is None:
            return None
        rows = self._db.execute(
            "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = ? AND first_event <= ? ORDER BY seq",
            (runtime_id, upto_event),
        )
        entries = [entry for values in rows for entry in ungrouped(*values) if entry.first_event <= upto_event]
        return StoredRuntime(_AGENTS.validate_json(row[0]), entries)

    async def entries_after_event(self, runtime_id: str, after_event: int, limit: int | None = None) -> list[Entry]:
        self._before_read()
        if limit is None:
            rows = self._db.execute(_AFTER_EVENT + " ORDER BY seq", (runtime_id, after_event))
            return [entry for seq, at, first, last, step in rows for entry in ungrouped(seq, at, first, last, step, after_event)]
        # In the order of journal_by_event (runtime_id, last_event, and the key's seq): a page
        # starts where its first row is, not at the journal's start; and it is the order of seq,
        # as a journal's last events never go down. A row holds one wanted entry at least.
        entries: list[Entry] = []
        rows = self._db.execute(_AFTER_EVENT + " ORDER BY last_event, seq LIMIT ?", (runtime_id, after_event, limit))
        try:
            for seq, at, first, last, step in rows:  # (a group row may hold the rest of the page: the others are not read)
                entries += ungrouped(seq, at, first, last, step, after_event, limit - len(entries))
                if len(entries) >= limit:
                    break
        finally:
            rows.close()
        return entries
