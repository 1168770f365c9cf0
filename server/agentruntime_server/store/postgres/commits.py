"""A PostgreSQL store's group commit: what every runtime appended is gathered in a batch,
and written by one statement (statements.COMMIT: one round trip, atomic) over the kept
connection, when the tick ends or, while a commit is under way, as soon as it ends; `flush`
awaits that commit. A commit writes only the runtimes whose row is there and, with
replicas, only those this process owns at the epoch they were appended under; the rest are
fenced. A failed commit makes the store unavailable, and its runtimes' copies stop
(`on_unwritten`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from ...domain.errors import Fenced, StoreUnavailable
from .batch import Batch
from .ownership import Ownership
from .statements import COMMIT
from .weather import PROBE_TIMEOUT, WEATHER

log = logging.getLogger("agentruntime_server.store.postgres")  # the store's log, named as before its split


class GroupCommit(Ownership):
    """What the runtimes appended and the tenants spent, written a batch at a time (the third
    layer of PostgresStore: the journal, runtimes and tenants build on it)."""

    def __init__(self, url: str, *, schema: str | None = None, pool_size: int = 10) -> None:
        super().__init__(url, schema=schema, pool_size=pool_size)
        self._open: Batch | None = None  # appended, not yet handed to a commit
        self._cut_due = False
        self._committing = False  # a commit is under way (one at a time)
        self._last: asyncio.Future[None] | None = None  # the latest commit's outcome
        self._writing: set[asyncio.Task[None]] = set()
        self._on_unwritten: list[Callable[[Collection[str]], None]] = []

    def _batch(self) -> Batch:
        if self._open is None:
            self._open = Batch(asyncio.get_running_loop())
        if not self._cut_due and not self._committing:
            self._cut_due = True
            asyncio.get_running_loop().call_soon(self._cut)
        return self._open

    def _cut(self) -> None:
        """Hands the open batch to a commit, unless one is under way: then the batch keeps
        growing until that commit ends, and goes next (group commit: while the database
        works, every runtime's appends gather into the next statement)."""
        self._cut_due = False
        if self._committing or self._open is None:
            return
        batch, self._open = self._open, None
        self._committing = True
        self._last = batch.done
        task = asyncio.get_running_loop().create_task(self._commit(batch))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _commit(self, batch: Batch) -> None:
        try:
            self.raise_if_away()
            if batch.touched or batch.tokens:
                await self._write(await self._writer(), batch, time.time())
        except BaseException as exc:
            try:
                refusal = self._failed(batch, exc)
            except Exception:  # its waiters must never hang: they are refused whatever failed here
                log.exception("the store could not settle a failed commit")
                refusal = StoreUnavailable()
            batch.done.set_exception(refusal)
            if self._last is batch.done:  # its waiters are told; a later flush awaits no failure of the past
                self._last = None
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        finally:
            self._committing = False
            if self._open is not None:
                self._cut()  # what gathered meanwhile
        batch.done.set_result(None)

    def _failed(self, batch: Batch, cause: BaseException) -> StoreUnavailable:
        """A commit failed: whether the database took it is not known (it may have, with the
        connection lost before its answer). Either way nothing of it was acknowledged; the
        copies of its runtimes stop, and are read again from the store once it is back."""
        if self._down is None:
            if isinstance(cause, WEATHER):
                log.warning("the store could not commit (%s: %s); reconnecting", type(cause).__name__, cause)
            else:
                log.error("the store could not commit (%s); reconnecting", type(cause).__name__, exc_info=cause)
        self._went_away(cause)
        self._unwritten(batch.touched)
        return self._refusal()

    def forget(self, runtime_id: str) -> None:
        # Replicas give the runtime's lease up as it leaves memory, which drops its next seq
        # (Ownership.released). A sole process drops it here, unless rows of it may be on
        # their way (buffered, or in the commit under way): kept then, as read from the
        # database before they land it would repeat their seqs.
        if self.leasing is not None or self._committing:
            return
        if self._open is None or runtime_id not in self._open.touched:
            self._next_seq.pop(runtime_id, None)

    def _unwritten(self, keys: Collection[str]) -> None:
        """These runtimes' copies are ahead of the store: their rows still buffered go (they
        follow seqs that were never written) and whoever holds the copies is told."""
        if not keys:
            return
        for key in keys:
            self.unwritten.add(key)
            self._next_seq.pop(key, None)
            if self._open is not None:
                self._open.forget(key)
        for callback in self._on_unwritten:
            callback(sorted(keys))

    def on_unwritten(self, callback: Callable[[Collection[str]], None]) -> None:
        """`callback(keys)`: these runtimes' last writes were not taken (a failed commit, an
        append while the store is away); their copies in memory must stop."""
        self._on_unwritten.append(callback)

    async def _write(self, connection: Any, batch: Batch, now: float) -> None:
        """The tick's journal rows and runtime updates in one statement (one round trip, atomic).

        Only runtimes whose row is there are written, and, for replicas, only those this
        process owns at the epoch their rows were appended under; their rows stay locked to
        the statement, so a claim or a delete waits for it, and no write of an earlier owner
        can land after a claim. The rest are refused: never acknowledged (flush(runtime)
        raises Fenced), as their rows were not written."""
        keys = sorted(batch.touched)
        owner = self.leasing.replica_id if self.leasing is not None else None
        rows = batch.rows
        running = [batch.running.get(key) for key in keys]
        counts = [batch.counts.get(key) for key in keys]
        written = await connection.fetch(
            COMMIT,
            keys,
            [batch.epochs.get(key, 0) for key in keys],
            owner,
            [row[0] for row in rows],
            [row[1] for row in rows],
            [row[2] for row in rows],
            [row[3] for row in rows],
            [row[4] for row in rows],
            [row[5] for row in rows],
            running,
            [c[0] if c else None for c in counts],
            [c[1] if c else None for c in counts],
            [c[2] if c else None for c in counts],
            now,
            [tenant for tenant, _ in batch.tokens],
            [minute for _, minute in batch.tokens],
            [tokens for tokens, _ in batch.tokens.values()],
            [batch.grown.get(key, 0) for key in keys],
            [micros for _, micros in batch.tokens.values()],
            [c.tokens if c else None for c in counts],
            [c.cost_micros if c else None for c in counts],
            [c.cost_currency if c else None for c in counts],
            [c.cost_priced if c else None for c in counts],
        )
        refused = set(keys) - {row[0] for row in written}
        if not refused:
            return
        if self.leasing is None:  # every runtime is this process's: only one deleted meanwhile is refused
            gone = refused
        else:  # a lost lease (rare): read whether the runtime was deleted or taken, for the caller's message
            present = await connection.fetch("SELECT id FROM runtimes WHERE id = ANY($1::text[])", sorted(refused))
            gone = refused - {row[0] for row in present}
        lost = []
        for key in sorted(refused):
            if self.epochs.get(key) == batch.epochs.get(key):  # not claimed again since
                self.lost(key, key in gone)
                lost.append(key)
        if self.leasing is not None:
            self.leasing.refused(lost, gone)

    async def _settle(self) -> None:
        """Every entry appended so far is committed (reads see them)."""
        self.raise_if_away()
        waited = self._open.done if self._open is not None else self._last
        self._cut()  # at once, if no commit is under way
        if waited is not None:
            await asyncio.shield(waited)
        self.raise_if_away()  # went away meanwhile (a read would wait for its connection)

    async def flush(self, runtime_id: str | None = None) -> None:
        self.raise_if_away()
        if self._open is not None:  # committed when the tick ends, or when the commit under way does
            waited: asyncio.Future[None] | None = self._open.done
        else:
            waited = self._last
        if waited is not None:
            await asyncio.shield(waited)
        if runtime_id is not None and runtime_id in self.fenced:
            raise Fenced(runtime_id, self.fenced[runtime_id])
        if runtime_id is not None and runtime_id in self.unwritten:  # its rows went with a failed commit
            raise self._refusal()

    async def close(self) -> None:
        try:
            if self._down is None:  # away: nothing more can be written (it was logged then)
                await self._settle()
        finally:
            if self._probing is not None:
                self._probing.cancel()
                await asyncio.gather(self._probing, return_exceptions=True)
            if self._writing:
                await asyncio.wait(list(self._writing))
            if self._pool is not None:
                pool, self._pool = self._pool, None
                if self._writer_connection is not None:
                    writer, self._writer_connection = self._writer_connection, None
                    try:
                        await writer.close(timeout=PROBE_TIMEOUT)
                    except Exception:  # the database went away: nothing left to say goodbye to
                        writer.terminate()
                try:  # a database away would hold a graceful close for good
                    await asyncio.wait_for(pool.close(), PROBE_TIMEOUT)
                except TimeoutError:
                    pool.terminate()
