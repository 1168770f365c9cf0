"""A SQLite store's group commit: the entries every runtime appends in one event-loop tick
are written in one transaction as the tick ends (paced on a saturated loop), and `flush`
waits for that commit. The runtimes whose rows a failed commit carried have copies ahead of
the store: whoever holds them is told (`on_unwritten`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Collection

from ...domain.errors import NotJournaled, StoreBroken, StoreCannotWrite
from ...domain.journal.tree import RuntimeCounts
from ..payloads import Row, grouped
from .connection import SqliteConnection
from .creations import APPEND, Creation
from .creations import write as write_creations

log = logging.getLogger("agentruntime_server.store.sqlite")  # the store's log, named as before its split
_TOUCH = (
    "UPDATE runtimes SET running = coalesce(?, running), handles = coalesce(?, handles), "
    "running_handles = coalesce(?, running_handles), suspended_handles = coalesce(?, suspended_handles), "
    "tokens = coalesce(?, tokens), cost_micros = coalesce(?, cost_micros), cost_currency = coalesce(?, cost_currency), "
    "cost_priced = coalesce(?, cost_priced), bytes = bytes + ?, updated_at = ? WHERE id = ?"
)
_UNCHANGED = (None,) * len(RuntimeCounts._fields)
COMMIT_PACE = 0.002  # seconds: a saturated loop's commits are at least this far apart
LOOP_BUSY = 0.0002  # seconds a commit waited for its turn: the loop had that much other work


class GroupCommit(SqliteConnection):
    """What the runtimes appended and the tenants spent, written a tick at a time (the second
    layer of SqliteStore: the journal, runtimes and tenants build on it)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._rows: list[Row] = []  # appended, not yet written
        self._running: dict[str, bool] = {}
        self._counts: dict[str, RuntimeCounts] = {}
        self._touched: set[str] = set()  # runtimes written this tick: their updated_at moves
        self._tokens: dict[tuple[str, int], tuple[int, int]] = {}  # (tenant, minute) -> (tokens, micros) this tick
        self._commit_due = False
        self._commit_asked = self._last_commit = 0.0
        self._paced: asyncio.TimerHandle | None = None
        self._committed: asyncio.Future[None] | None = None
        self._on_unwritten: list[Callable[[Collection[str]], None]] = []
        # Runtimes whose rows a failed commit carried (or whose append was refused), until
        # loaded or created again: their copies are ahead of the store.
        self.unwritten: set[str] = set()
        self._creations: list[Creation] = []  # runtimes to create, in the next commit
        self._creating: set[str] = set()  # their ids, until it is written
        self._next_seq: dict[str, int] = {}  # per runtime in memory: the seq its next entry must have
        self._forgetting: set[str] = set()  # runtimes gone from memory whose rows are still buffered

    # Group commit: the entries appended in one event-loop tick, by every runtime, are
    # written in one statement and one transaction when the tick ends. flush() waits for
    # that commit; it runs before anything leaves the process that a lost write would make
    # wrong (an RPC's acknowledgement, a watched event, a side-effecting tool call), so
    # calls made in the same tick share one commit. A crash can only lose entries whose
    # effects have not left the process, which replay and the in-doubt rules already treat
    # as in flight.
    #
    # A loop saturated with work commits at most every COMMIT_PACE: when the commit's turn
    # comes more than LOOP_BUSY after it was asked for, the loop had that much other work
    # queued ahead of it, and a commit within COMMIT_PACE of the last one waits for the pace.
    # More steps then share each commit's fixed cost (its locks, the pages every commit
    # writes), at no cost to a loop with time to spare. Measured (docs/performance.md): 13 %
    # less CPU per model turn at C = 20 with no model latency; the same turns/s at C = 1 and
    # with 20 ms of latency.

    def _schedule_commit(self) -> None:
        if self._commit_due:
            return
        self._commit_due = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a tool or a test): commit now
            self._commit()
            return
        self._commit_asked = time.monotonic()
        loop.call_soon(self._commit_when_paced)

    def _commit_when_paced(self) -> None:
        if not self._commit_due:  # committed meanwhile (a read commits what is buffered first)
            return
        now = time.monotonic()
        if now - self._commit_asked > LOOP_BUSY and now - self._last_commit < COMMIT_PACE:
            self._paced = asyncio.get_running_loop().call_later(self._last_commit + COMMIT_PACE - now, self._commit_quietly)
            return
        self._commit_quietly()

    def _commit_quietly(self) -> None:
        """A commit of its own (a loop callback): a failure is logged, and its waiters told, by _commit."""
        with contextlib.suppress(StoreCannotWrite, StoreBroken):
            self._commit()

    def _commit(self) -> None:
        self._commit_due = False
        if self._paced is not None:
            self._paced.cancel()
            self._paced = None
        committed, self._committed = self._committed, None
        creations, self._creations = self._creations, []
        if self._broken is not None:
            if committed is not None and not committed.done():
                committed.set_exception(self._broken)
            self._created(creations, self._broken)
            raise self._broken.with_traceback(None)
        if self._down is not None:
            # Nothing of a runtime is buffered (appends are refused meanwhile): tokens counted
            # wait for the store to write again, and reads go on.
            if committed is not None and not committed.done():
                committed.set_exception(self._refusal())
            self._created(creations, self._refusal())
            self._forget_committed()
            return
        running: dict[str, bool] = {}
        touched: set[str] = set()  # (for the failure's report)
        refused: dict[Creation, Exception] = {}
        try:
            if self._rows or self._running or self._tokens or creations:
                rows, running, counts, touched = self._rows, self._running, self._counts, self._touched
                self._rows, self._running, self._counts, self._touched = [], {}, {}, set()
                tokens, self._tokens = self._tokens, {}
                self._last_commit = time.monotonic()  # the pace spaces transactions, not reads that found nothing to write
                now = time.time()
                groups = grouped(rows)
                grown: dict[str, int] = {}  # the bytes each runtime adds
                for group in groups:
                    grown[group[0]] = grown.get(group[0], 0) + len(group[5])
                with self._transaction() as db:
                    refused = write_creations(db, creations)
                    db.executemany(APPEND, groups)
                    # One statement per runtime written: its last write, its growth, and what changed
                    # of its running flag and handle counts (NULL: unchanged).
                    db.executemany(
                        _TOUCH,
                        [
                            (running.get(key), *counts.get(key, _UNCHANGED), grown.get(key, 0), now, key)
                            for key in touched | running.keys()
                        ],
                    )
                    db.executemany(
                        "INSERT INTO tenant_tokens (tenant, minute, tokens, micros) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (tenant, minute) DO UPDATE SET tokens = tokens + excluded.tokens, "
                        "micros = micros + excluded.micros",
                        [(tenant, minute, spent, cost) for (tenant, minute), (spent, cost) in tokens.items()],
                    )
        except sqlite3.OperationalError as exc:
            refusal = self._cannot_write(exc)
            self._unwritten(touched | running.keys())
            if committed is not None and not committed.done():
                committed.set_exception(refusal)
            self._created(creations, refusal)
            raise refusal from exc
        except BaseException as exc:
            log.error("the store could not commit (%s); restart the server", type(exc).__name__, exc_info=exc)
            self._broken = StoreBroken()
            if committed is not None and not committed.done():
                committed.set_exception(self._broken)
            self._created(creations, self._broken)
            for callback in self._on_health:
                callback(False)
            raise self._broken from exc
        if committed is not None and not committed.done():
            committed.set_result(None)
        self._created(creations, refused=refused)
        self._forget_committed()

    def _created(
        self, creations: list[Creation], failure: BaseException | None = None, refused: dict[Creation, Exception] | None = None
    ) -> None:
        """The creations' callers are told how the commit went: written, or why not (the
        commit's `failure`, or a creation's own refusal)."""
        for creation in creations:
            self._creating.discard(creation.runtime_id)
            why = failure or (refused or {}).get(creation)
            if creation.written.done():
                continue
            if why is None:
                creation.written.set_result(None)
            else:
                creation.written.set_exception(why.with_traceback(None))

    def forget(self, runtime_id: str) -> None:
        # A runtime whose rows are still buffered keeps its next seq until they are committed:
        # read from the file before, it would repeat theirs.
        if runtime_id in self._touched or runtime_id in self._running:
            self._forgetting.add(runtime_id)
        else:
            self._next_seq.pop(runtime_id, None)

    def _forget_committed(self) -> None:
        if self._forgetting:
            for runtime_id in self._forgetting:
                self._next_seq.pop(runtime_id, None)
            self._forgetting.clear()

    def _before_read(self) -> None:
        """Reads see every entry appended so far: what is buffered is committed first. A read
        goes on whether or not that commit fails (its writers are told, and their copies stop):
        it reads what the store holds."""
        if self._broken is not None:
            raise self._broken.with_traceback(None)
        with contextlib.suppress(StoreCannotWrite):
            self._commit()

    def _writes_again(self) -> None:
        if self._tokens:
            self._schedule_commit()

    def _unwritten(self, keys: Collection[str]) -> None:
        """These runtimes' copies are ahead of the store: whoever holds them is told."""
        if not keys:
            return
        for key in keys:
            self.unwritten.add(key)
            self._next_seq.pop(key, None)
        for callback in self._on_unwritten:
            callback(sorted(keys))

    def on_unwritten(self, callback: Callable[[Collection[str]], None]) -> None:
        """`callback(keys)`: these runtimes' last writes were not taken (a failed commit, an
        append while the store could not write); their copies in memory must stop."""
        self._on_unwritten.append(callback)

    async def flush(self, runtime_id: str | None = None) -> None:
        if self._broken is not None:
            raise self._broken.with_traceback(None)
        if runtime_id is not None and runtime_id in self.unwritten:  # its rows went with a failed commit
            raise self._refusal() if self._down is not None else NotJournaled(runtime_id)
        if self._down is not None:
            return  # nothing of a runtime is buffered while the store cannot write (appends are refused)
        if not (self._rows or self._running or self._tokens):
            return
        if self._committed is None:
            self._committed = asyncio.get_running_loop().create_future()
        self._schedule_commit()
        await asyncio.shield(self._committed)

    async def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
        try:
            if self._broken is None and self._down is None:  # else nothing more can be written (it was logged then)
                self._commit()
        finally:
            self._db.close()
