"""A SQLite store's connection: the file opened (WAL) and migrated, its write transactions,
and its health. A write that fails for want of space or I/O stops the store's writes until a
probe (a one-row write, every PROBE_EVERY seconds) goes through; the health callbacks say so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ...domain.errors import StoreCannotWrite
from .disk import ROOM, create_private, disk_full, free_bytes
from .migrations import migrate

log = logging.getLogger("agentruntime_server.store.sqlite")  # the store's log, named as before its split
PROBE_EVERY = 0.5  # seconds between attempts to write again, once a write failed for want of space or I/O
_PROBE = "INSERT INTO store_probe (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at"


class SqliteConnection:
    """The connection, its transactions and its health (the first layer of SqliteStore)."""

    def __init__(self, path: str) -> None:
        self._directory = None if path == ":memory:" else Path(path).absolute().parent
        if path != ":memory:":
            create_private(Path(path))
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a committed write survives a process crash
        self._db.execute("PRAGMA busy_timeout=5000")
        migrate(self._db)
        # A commit that failed past mending (not for space or I/O): nothing is acknowledged
        # after it, ever. (Raised without the traceback of its last raise: one exception raised
        # again keeps every frame.)
        self._broken: BaseException | None = None
        # A write failed for want of space or I/O: set until a probe writes again (`_probing`).
        self._down: sqlite3.OperationalError | None = None
        self._full = False  # ...for want of space (judged once, as it failed, not at each refusal)
        self._probing: asyncio.Task[None] | None = None
        self._on_health: list[Callable[[bool], None]] = []

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
                free = free_bytes(self._directory)
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
        self._writes_again()

    def _writes_again(self) -> None:
        """A probe wrote: the store takes writes again (GroupCommit writes what waited for it)."""

    def on_health(self, callback: Callable[[bool], None]) -> None:
        """`callback(False)` when a write fails (for want of space or I/O: `callback(True)` once
        a probe writes again; any other failure breaks the store until the server restarts)."""
        self._on_health.append(callback)


def _roll_back(db: sqlite3.Connection) -> None:
    if not db.in_transaction:  # SQLite rolled it back itself (it may, on a full disk or an I/O error)
        return
    try:
        db.execute("ROLLBACK")
    except sqlite3.Error:  # the connection keeps no half transaction: SQLite ends it even so
        log.warning("the store could not roll a failed write back", exc_info=True)
