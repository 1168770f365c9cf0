"""`sqlite:///path`: the durable default. WAL mode, one writer (this process). A runtime is
a row of definitions plus its journal, appended in order: a row per group commit and
runtime, holding the steps it wrote then (`payloads.grouped`; rows written before schema 6
hold one step each).

Each message is in exactly one step, so storage grows with the transcript and not with
its square (a model call's prompt is the transcript so far, never a new copy of it).
Calls run on the event loop thread: a write is a short local statement and no await
happens inside one, so it is atomic with respect to the runtime's in-memory state.

A write that fails for want of space or I/O (sqlite3.OperationalError: a full disk, a file
another process keeps locked) is weather (docs/durability.md#store-unavailable): it is
rolled back whole, and the store takes no writes until a probe (a one-row write, every
PROBE_EVERY seconds) goes through. Meanwhile appends, flushes and writes raise
errors.StoreCannotWrite (UNAVAILABLE STORE_FULL to callers), reads go on, the health
callbacks say so, and the runtimes whose rows the failed commit carried are reported
`on_unwritten` (their copies are ahead of the store: they stop, and are read again once it
writes). Any other failed commit (a constraint broken by its own write, a damaged file)
breaks the store for good: errors.StoreBroken until the server is restarted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path

from pydantic import TypeAdapter

from ...domain.errors import NotJournaled, RequestIdTaken, RuntimeExists, StoreBroken, StoreCannotWrite
from ...domain.journal import Entry
from ...domain.journal.tree import RuntimeCounts
from ...domain.ports import RuntimeRow, StoredRuntime, TenantReply
from ...domain.tenancy.quotas import runtimes_quota_reached
from ...domain.vocabulary import AgentSpec
from ..payloads import Row, definitions_json, grouped, journal_rows, ungrouped
from .migrations import migrate

log = logging.getLogger(__name__)
_AGENTS = TypeAdapter(tuple[AgentSpec, ...])
_APPEND = "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step, last_seq) VALUES (?, ?, ?, ?, ?, ?, ?)"
_COUNT = "SELECT COUNT(*) FROM runtimes WHERE tenant = ?"
_TOUCH = (
    "UPDATE runtimes SET running = coalesce(?, running), handles = coalesce(?, handles), "
    "running_handles = coalesce(?, running_handles), suspended_handles = coalesce(?, suspended_handles), "
    "tokens = coalesce(?, tokens), cost_micros = coalesce(?, cost_micros), cost_currency = coalesce(?, cost_currency), "
    "cost_priced = coalesce(?, cost_priced), bytes = bytes + ?, updated_at = ? WHERE id = ?"
)
_UNCHANGED = (None,) * len(RuntimeCounts._fields)
_AFTER_EVENT = "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = ? AND last_event > ?"
_LISTED = "id, tenant, created_at, handles, running_handles, suspended_handles, tokens, cost_micros, cost_currency, cost_priced"
COMMIT_PACE = 0.002  # seconds: a saturated loop's commits are at least this far apart
LOOP_BUSY = 0.0002  # seconds a commit waited for its turn: the loop had that much other work
# Retention's test (ports.Store.idle_runtimes): nothing running, and not written since the
# cutoff of its kind (NULL: never idle); `latest`, the later cutoff, bounds the index scan.
PROBE_EVERY = 0.5  # seconds between attempts to write again, once a write failed for want of space or I/O
ROOM = 1 << 20  # bytes: with less free on its disk, an I/O error is taken for a full disk
_SQLITE_IOERR, _SQLITE_FULL = 10, 13  # (primary result codes)
_PROBE = "INSERT INTO store_probe (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at"
_IDLE = "updated_at < :latest AND running = 0 AND updated_at < CASE WHEN suspended_handles = 0 THEN :settled ELSE :suspended END"


class SqliteStore:
    durable = True

    def __init__(self, path: str) -> None:
        self._directory = None if path == ":memory:" else Path(path).absolute().parent
        if path != ":memory:":
            _create_private(Path(path))
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a committed write survives a process crash
        self._db.execute("PRAGMA busy_timeout=5000")
        migrate(self._db)
        self._rows: list[Row] = []  # appended, not yet written
        self._running: dict[str, bool] = {}
        self._counts: dict[str, RuntimeCounts] = {}
        self._touched: set[str] = set()  # runtimes written this tick: their updated_at moves
        self._tokens: dict[tuple[str, int], tuple[int, int]] = {}  # (tenant, minute) -> (tokens, micros) this tick
        self._commit_due = False
        self._commit_asked = self._last_commit = 0.0
        self._paced: asyncio.TimerHandle | None = None
        self._committed: asyncio.Future[None] | None = None
        # A commit that failed past mending (not for space or I/O): nothing is acknowledged
        # after it, ever. (Raised without the traceback of its last raise: one exception raised
        # again keeps every frame.)
        self._broken: BaseException | None = None
        # A write failed for want of space or I/O: set until a probe writes again (`_probing`).
        self._down: sqlite3.OperationalError | None = None
        self._full = False  # ...for want of space (judged once, as it failed, not at each refusal)
        self._probing: asyncio.Task[None] | None = None
        self._on_health: list[Callable[[bool], None]] = []
        self._on_unwritten: list[Callable[[Collection[str]], None]] = []
        # Runtimes whose rows a failed commit carried (or whose append was refused), until
        # loaded or created again: their copies are ahead of the store.
        self.unwritten: set[str] = set()
        self._next_seq: dict[str, int] = {}  # per runtime: the seq its next entry must have

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
        if self._broken is not None:
            if committed is not None and not committed.done():
                committed.set_exception(self._broken)
            raise self._broken.with_traceback(None)
        if self._down is not None:
            # Nothing of a runtime is buffered (appends are refused meanwhile): tokens counted
            # wait for the store to write again, and reads go on.
            if committed is not None and not committed.done():
                committed.set_exception(self._refusal())
            return
        running: dict[str, bool] = {}
        touched: set[str] = set()  # (for the failure's report)
        try:
            if self._rows or self._running or self._tokens:
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
                    db.executemany(_APPEND, groups)
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
            raise refusal from exc
        except BaseException as exc:
            log.error("the store could not commit (%s); restart the server", type(exc).__name__, exc_info=exc)
            self._broken = StoreBroken()
            if committed is not None and not committed.done():
                committed.set_exception(self._broken)
            for callback in self._on_health:
                callback(False)
            raise self._broken from exc
        if committed is not None and not committed.done():
            committed.set_result(None)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (IMMEDIATE), committed or rolled back whole
        (a COMMIT that fails for want of space may leave it open, or SQLite may have rolled it
        back already)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            _roll_back(self._db)
            raise

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """A write of its own (not the group commit's): refused while the store cannot write,
        and a failure for want of space or I/O makes it so."""
        self._raise_if_cannot_write()
        try:
            with self._transaction() as db:
                yield db
        except sqlite3.OperationalError as exc:
            raise self._cannot_write(exc) from exc

    def _before_read(self) -> None:
        """Reads see every entry appended so far: what is buffered is committed first. A read
        goes on whether or not that commit fails (its writers are told, and their copies stop):
        it reads what the store holds."""
        if self._broken is not None:
            raise self._broken.with_traceback(None)
        with contextlib.suppress(StoreCannotWrite):
            self._commit()

    def _raise_if_cannot_write(self) -> None:
        if self._broken is not None:
            raise self._broken.with_traceback(None)
        if self._down is not None:
            raise self._refusal()

    def _cannot_write(self, cause: sqlite3.OperationalError) -> StoreCannotWrite:
        """A write failed for want of space or I/O, and was rolled back: no write is taken
        until a probe goes through, and the health callbacks are told."""
        if self._down is None:
            log.warning("the store could not write (%s: %s); trying again every %s s", type(cause).__name__, cause, PROBE_EVERY)
            self._down = cause
            self._full = disk_full(cause, self._directory)
            for callback in self._on_health:
                callback(False)
        return self._refusal()

    def _refusal(self) -> StoreCannotWrite:
        assert self._down is not None
        self._start_probing()
        refusal = StoreCannotWrite(full=self._full)
        refusal.__cause__ = self._down
        return refusal

    def _start_probing(self) -> None:
        if self._probing is not None:
            return
        try:
            self._probing = asyncio.get_running_loop().create_task(self._probe())
        except RuntimeError:  # no event loop (a tool or a test): the next refusal on a loop starts it
            pass

    async def _probe(self) -> None:
        """Until the store can write again: then it takes writes. Each attempt first moves the
        write-ahead log into the database and truncates it (a full disk may get room back
        from that alone); after a full disk it waits for ROOM free, since a one-row write
        fits in the log's leftover space where the next commit would not; then a one-row
        write must go through."""
        while True:
            await asyncio.sleep(PROBE_EVERY)
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.debug("the store could not checkpoint (%s)", exc)
            if self._full and self._directory is not None:
                free = _free_bytes(self._directory)
                if free is not None and free < ROOM:
                    continue
            try:
                with self._transaction() as db:
                    db.execute(_PROBE, (time.time(),))
            except sqlite3.Error as exc:
                log.debug("the store still cannot write (%s)", exc)
                continue
            break
        log.warning("the store can write again")
        self._down = None
        self._probing = None
        for callback in self._on_health:
            callback(True)
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

    def on_health(self, callback: Callable[[bool], None]) -> None:
        """`callback(False)` when a write fails (for want of space or I/O: `callback(True)` once
        a probe writes again; any other failure breaks the store until the server restarts)."""
        self._on_health.append(callback)

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

    # ---- writes --------------------------------------------------------------------------

    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        tenant: str = "default",
        entries: Sequence[Entry] = (),
        quota: int = 0,
        reply: TenantReply | None = None,
    ) -> None:
        groups = grouped(journal_rows(runtime_id, 1, entries)[0])
        now = time.time()
        # Its own transaction, not the group commit's: a runtime is created once, and acknowledged at once.
        with self._writing() as db:
            if quota and db.execute(_COUNT, (tenant,)).fetchone()[0] >= quota:
                raise runtimes_quota_reached(tenant, quota)
            try:
                definitions = definitions_json(agents)
                db.execute(
                    "INSERT INTO runtimes (id, agents, created_at, tenant, updated_at, bytes) VALUES (?, ?, ?, ?, ?, ?)",
                    (runtime_id, definitions, now, tenant, now, len(definitions) + sum(len(group[5]) for group in groups)),
                )
            except sqlite3.IntegrityError:
                raise RuntimeExists(runtime_id) from None
            # Journal rows under the id belong to no runtime (its row was just inserted): its
            # row was deleted without them (by hand, or by another process on the file while
            # this one appended). The new runtime must not inherit their seqs and handles.
            db.execute("DELETE FROM journal WHERE runtime_id = ?", (runtime_id,))
            db.executemany(_APPEND, groups)
            _keep(db, reply)
        self._next_seq.pop(runtime_id, None)  # read again at its first append, from what is there now
        self.unwritten.discard(runtime_id)

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

    # ---- reads ---------------------------------------------------------------------------

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

    async def list_runtimes(self, tenant: str, after: tuple[float, str] | None, limit: int) -> list[RuntimeRow]:
        self._before_read()
        query = (
            f"SELECT {_LISTED} FROM runtimes WHERE tenant = ?"
            + (" AND (created_at < ? OR (created_at = ? AND id < ?))" if after else "")
            + " ORDER BY created_at DESC, id DESC LIMIT ?"
        )
        parameters = (tenant, after[0], after[0], after[1], limit) if after else (tenant, limit)
        return [_row(*row) for row in self._db.execute(query, parameters)]

    async def delete_runtime(self, runtime_id: str, reply: TenantReply | None = None) -> None:
        self._commit()
        with self._writing() as db:
            _keep(db, reply)
            db.execute("DELETE FROM journal WHERE runtime_id = ?", (runtime_id,))
            db.execute("DELETE FROM runtimes WHERE id = ?", (runtime_id,))
        self._next_seq.pop(runtime_id, None)

    async def reply(self, tenant: str, scope: str, request_id: str) -> TenantReply | None:
        row = self._db.execute(
            "SELECT rpc, digest, runtime_id, at FROM replies WHERE tenant = ? AND scope = ? AND request_id = ?",
            (tenant, scope, request_id),
        ).fetchone()
        return TenantReply(tenant, scope, request_id, *row) if row else None

    async def forget_replies_before(self, at: float) -> None:
        with self._writing() as db:
            db.execute("DELETE FROM replies WHERE at < ?", (at,))

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

    async def runtimes_with_running_handles(self) -> list[str]:
        self._before_read()
        return [runtime_id for (runtime_id,) in self._db.execute("SELECT id FROM runtimes WHERE running = 1 ORDER BY id")]

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


def _cutoffs(settled: float | None, suspended: float | None) -> dict[str, float | None] | None:
    """_IDLE's parameters; None when both kinds are kept for ever."""
    given = [cutoff for cutoff in (settled, suspended) if cutoff is not None]
    return {"latest": max(given), "settled": settled, "suspended": suspended} if given else None


def disk_full(error: sqlite3.Error, directory: Path | None) -> bool:
    """Whether a write failed for want of space: SQLITE_FULL, or an I/O error on
    a disk with less than ROOM free (SQLite reports a full disk as an I/O error where it maps
    memory, as it opens a store)."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code == _SQLITE_FULL:
        return True
    if code != _SQLITE_IOERR or directory is None:
        return False
    free = _free_bytes(directory)
    return free is not None and free < ROOM


def _free_bytes(directory: Path) -> int | None:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def _roll_back(db: sqlite3.Connection) -> None:
    if not db.in_transaction:  # SQLite rolled it back itself (it may, on a full disk or an I/O error)
        return
    try:
        db.execute("ROLLBACK")
    except sqlite3.Error:  # the connection keeps no half transaction: SQLite ends it even so
        log.warning("the store could not roll a failed write back", exc_info=True)


def _keep(db: sqlite3.Connection, reply: TenantReply | None) -> None:
    """A CreateRuntime's or DeleteRuntime's answer, in the transaction of its effect."""
    if reply is None:
        return
    try:
        db.execute(
            "INSERT INTO replies (tenant, scope, request_id, rpc, digest, runtime_id, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (reply.tenant, reply.scope, reply.request_id, reply.rpc, reply.digest, reply.runtime_id, reply.at),
        )
    except sqlite3.IntegrityError:  # (the transaction rolls back: nothing created or deleted)
        raise RequestIdTaken(f"request id {reply.request_id!r} was answered already") from None


def _create_private(path: Path) -> None:
    """The store holds tool header values (secrets) and every transcript: a directory it
    creates is owner-only (0700), and so is the file (0600). SQLite gives its -wal and -shm
    files the database file's mode."""
    directory = path.parent.absolute()
    for ancestor in [*reversed(directory.parents), directory]:
        if not ancestor.exists():
            ancestor.mkdir(mode=0o700, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def _row(runtime_id: str, tenant: str, created_at: float, *counts: object) -> RuntimeRow:
    handles, running, suspended, tokens, micros, currency, priced = counts
    figures = RuntimeCounts(handles, running, suspended, tokens, micros, currency, bool(priced))  # type: ignore[arg-type]
    return RuntimeRow(runtime_id, tenant, created_at, figures)
