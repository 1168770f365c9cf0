"""`postgresql://user:password@host:port/db`: the store on PostgreSQL (asyncpg, one pool).

The same logical tables and the same semantics as SqliteStore (store/sqlite/): a runtime
is a row of definitions plus its journal, one row per step, appended in order; an append is
checked (its seqs) and encoded when it is made, all or nothing, and buffered; the rows every
runtime appended are written by one statement (statements.COMMIT: one round trip,
atomic) over one kept connection, when the tick ends or, while a commit is under way, as
soon as it ends (the next commit gathers everything appended meanwhile); `flush` awaits that commit.

The database going away is weather (docs/durability.md#store-unavailable): a commit that
fails, or any statement that loses its connection, makes the store unavailable until a probe
reaches the database again (every PROBE_EVERY seconds). Meanwhile every flush, append and
read raises errors.StoreUnavailable at once (UNAVAILABLE STORE_UNAVAILABLE to callers), and
the health callbacks say so (`on_health`). The runtimes whose rows a failed commit carried,
or whose append was refused, have copies in memory ahead of the store: their rows still
buffered are forgotten, and the `on_unwritten` callbacks are told, so that those copies stop
and are read again from the store once it is back. Nothing unacknowledged is kept as if it
had been written, and nothing acknowledged is lost.

asyncpg is asynchronous, so commits overlap the event loop: they run one after another. Reads first await every commit of what was
appended before them (a store reads its own writes). The pool connects, and the schema is
migrated, on first use: opening a store (app.open_store) is synchronous.

Every commit first locks the rows of the runtimes it writes, and writes only runtimes whose
row is there (one deleted meanwhile, by another process, takes no rows). Replicas
(store/postgres/leases.py): once a PostgresLeases is attached, it keeps only the writes of
runtimes this process owns at the epoch it appended them under. The rest are refused
(fenced), never written, and every later append or flush(runtime) of that runtime raises
errors.Fenced, which says whether the runtime was deleted or another replica holds it.

The URL's password is a secret: it is never logged, and `redacted(url)` is what may be."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, Protocol

import asyncpg  # type: ignore[import-untyped]
from pydantic import TypeAdapter

from ...domain.errors import Fenced, RequestIdTaken, RuntimeExists, StoreUnavailable
from ...domain.journal import Entry
from ...domain.journal.tree import RuntimeCounts
from ...domain.ports import RuntimeRow, StoredRuntime, TenantReply
from ...domain.tenancy.quotas import runtimes_quota_reached
from ...domain.vocabulary import AgentSpec
from ..payloads import definitions_json, journal_rows, payload_bytes
from ..urls import redacted
from . import statements as sql
from .batch import Batch
from .migrations import migrate
from .weather import PROBE_EVERY, PROBE_TIMEOUT, WEATHER, guarded

log = logging.getLogger(__name__)
_AGENTS = TypeAdapter(tuple[AgentSpec, ...])


class Leasing(Protocol):
    """What the store needs of the leases attached to it (store/postgres/leases.py): the replica
    whose writes it keeps, whom to tell of the writes it refused (`gone`: their runtime's row
    was deleted), and the runtime it creates for this replica meanwhile."""

    @property
    def replica_id(self) -> str: ...

    def refused(self, keys: Iterable[str], gone: Collection[str] = ()) -> None: ...

    def creating(self, runtime_id: str) -> contextlib.AbstractContextManager[None]: ...


class PostgresStore:
    durable = True

    def __init__(self, url: str, *, schema: str | None = None, pool_size: int = 10) -> None:
        """`schema`: the tables live in this schema (created if missing) rather than the
        connection's default one (tests: one schema a test)."""
        self._url = url
        self._schema = schema
        self._pool_size = pool_size
        self._pool: Any = None
        self._connecting = asyncio.Lock()
        self._open: Batch | None = None  # appended, not yet handed to a commit
        self._cut_due = False
        self._committing = False  # a commit is under way (one at a time)
        self._writer_connection: Any = None
        self._last: asyncio.Future[None] | None = None  # the latest commit's outcome
        self._writing: set[asyncio.Task[None]] = set()
        # The database went away: set until a probe reaches it again (`_probing`).
        self._down: BaseException | None = None
        self._probing: asyncio.Task[None] | None = None
        self._on_health: list[Callable[[bool], None]] = []
        self._on_unwritten: list[Callable[[Collection[str]], None]] = []
        # Runtimes whose rows a failed commit carried (or whose append was refused), until
        # loaded, claimed or created again: their copies are ahead of the store.
        self.unwritten: set[str] = set()
        self._next_seq: dict[str, int] = {}  # per runtime: the seq its next entry must have
        # Replicas: the leases, and the epoch of every runtime this process owns.
        self.leasing: Leasing | None = None
        self.epochs: dict[str, int] = {}
        # The runtimes whose writes were refused since (until claimed, loaded or created
        # again), each with whether its row was gone (else another replica held it).
        self.fenced: dict[str, bool] = {}

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self._url)!r})"

    async def connect(self) -> None:
        """Connects and migrates now, rather than at first use (a server's start fails at once)."""
        await self.pool()

    async def pool(self) -> Any:
        """The connection pool (connected, and the schema migrated, at the first call);
        StoreUnavailable while the database is away."""
        self.raise_if_away()
        return await self._connected()

    def _settings(self) -> dict[str, str]:
        settings = {"application_name": "agentruntime"}
        if self._schema is not None:
            settings["search_path"] = self._schema
        return settings

    async def _connected(self) -> Any:
        if self._pool is None:
            async with self._connecting:
                if self._pool is None:
                    pool = await asyncpg.create_pool(
                        self._url, min_size=1, max_size=self._pool_size, server_settings=self._settings()
                    )
                    try:
                        async with pool.acquire() as connection:
                            await migrate(connection, self._schema)
                    except BaseException:
                        await pool.close()
                        raise
                    self._pool = pool
        return self._pool

    # ---- group commit --------------------------------------------------------------------

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

    def _went_away(self, cause: BaseException) -> None:
        """Unavailable until a probe reaches the database: the writer's connection (dead, or
        in an unknown state) is thrown away, and the health callbacks told."""
        writer, self._writer_connection = self._writer_connection, None
        if writer is not None:
            writer.terminate()
        if self._down is not None:
            return
        self._down = cause
        for callback in self._on_health:
            callback(False)
        self._probing = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """Until the database answers again: then the store takes writes and reads again."""
        while True:
            await asyncio.sleep(PROBE_EVERY)
            try:
                pool = await self._connected()
                await pool.expire_connections()  # those it holds may be dead: each is replaced at its next use
                async with pool.acquire(timeout=PROBE_TIMEOUT) as connection:
                    await connection.fetchval("SELECT 1", timeout=PROBE_TIMEOUT)
            except Exception as exc:
                log.debug("the store is still away (%s)", type(exc).__name__)
                continue
            break
        log.warning("the store is reachable again")
        self._down = None
        self._probing = None
        for callback in self._on_health:
            callback(True)

    def _refusal(self) -> StoreUnavailable:
        refusal = StoreUnavailable()
        refusal.__cause__ = self._down
        return refusal

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """A statement that loses its database raises StoreUnavailable, and makes the store
        unavailable until a probe reaches the database again."""
        try:
            yield
        except WEATHER as exc:
            if self._down is None:
                log.warning("the store lost its database (%s: %s); reconnecting", type(exc).__name__, exc)
            self._went_away(exc)
            raise self._refusal() from exc

    def on_health(self, callback: Callable[[bool], None]) -> None:
        """`callback(False)` when the database goes away, `callback(True)` once it is back."""
        self._on_health.append(callback)

    def on_unwritten(self, callback: Callable[[Collection[str]], None]) -> None:
        """`callback(keys)`: these runtimes' last writes were not taken (a failed commit, an
        append while the store is away); their copies in memory must stop."""
        self._on_unwritten.append(callback)

    @property
    def available(self) -> bool:
        return self._down is None

    def raise_if_away(self) -> None:
        """StoreUnavailable while the database is away."""
        if self._down is not None:
            raise self._refusal()

    # ---- ownership (replicas: what the leases claimed, gave up or lost) ------------------

    def claimed(self, runtime_id: str, epoch: int) -> None:
        """This process owns the runtime from this epoch on: its writes are no longer refused,
        and its next seq is read again (another replica may have written since)."""
        self.epochs[runtime_id] = epoch
        self.fenced.pop(runtime_id, None)
        self._next_seq.pop(runtime_id, None)
        self.unwritten.discard(runtime_id)

    def released(self, runtime_id: str | None = None) -> None:
        """This process no longer owns the runtime (None: any runtime, as it stops)."""
        if runtime_id is None:
            self.epochs.clear()
            self._next_seq.clear()
        else:
            self.epochs.pop(runtime_id, None)
            self._next_seq.pop(runtime_id, None)

    def lost(self, runtime_id: str, deleted: bool) -> None:
        """Another replica holds the runtime now, or (`deleted`) its row is gone: every later
        write of it is refused (Fenced)."""
        self.epochs.pop(runtime_id, None)
        self.fenced[runtime_id] = deleted
        self._next_seq.pop(runtime_id, None)

    async def _writer(self) -> Any:
        """The connection commits go through: one, kept (commits run one at a time anyway,
        and a pool's release would cost a round trip of its own each time). Its own, not the
        pool's: a pool takes back a connection the server ended, under its holder, and may
        hand it out again while the holder still has it."""
        if self._writer_connection is None:
            await self.pool()  # connected and migrated first
            self._writer_connection = await asyncpg.connect(self._url, server_settings=self._settings(), timeout=PROBE_TIMEOUT)
        return self._writer_connection

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
            sql.COMMIT,
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

    # ---- writes --------------------------------------------------------------------------

    @guarded
    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        tenant: str = "default",
        entries: Sequence[Entry] = (),
        quota: int = 0,
        reply: TenantReply | None = None,
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
        )
        # Until its epoch is recorded below, a renewal that already reads the new row must not
        # release it as a runtime this replica no longer holds (another would then claim it
        # while this replica answers from its own copy).
        creating = self.leasing.creating(runtime_id) if self.leasing is not None else contextlib.nullcontext()
        with creating:
            try:  # its own transaction, not the group commit's: a runtime is created once, and acknowledged at once
                if not quota and reply is None:
                    created = await pool.fetchval(sql.CREATE, *parameters)
                else:
                    async with pool.acquire() as connection, connection.transaction():
                        await _keep(connection, reply)
                        # Creates of one tenant, from any process, one at a time: each counts
                        # in a statement that starts once the one before has committed (READ
                        # COMMITTED reads as of the start of a statement, so the count cannot
                        # share a statement with the wait; and without the lock, two creates
                        # at once would each count before the other's insert, and both pass).
                        if quota:
                            await connection.execute(
                                "SELECT pg_advisory_xact_lock($1, $2)", sql.QUOTA_LOCK, sql.tenant_lock(tenant)
                            )
                        created = await connection.fetchval(sql.CREATE, *parameters)
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
    async def delete_runtime(self, runtime_id: str, reply: TenantReply | None = None) -> None:
        await self._settle()
        pool = await self.pool()
        async with pool.acquire() as connection, connection.transaction():
            await _keep(connection, reply)
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

    # ---- reads ---------------------------------------------------------------------------

    @guarded
    async def load(self, runtime_id: str) -> StoredRuntime | None:
        await self._settle()
        pool = await self.pool()
        epoch = self.epochs.get(runtime_id)  # replicas: the lease this read may speak for
        async with pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
            agents = await connection.fetchval("SELECT agents FROM runtimes WHERE id = $1", runtime_id)
            if agents is None:
                return None
            rows = await connection.fetch(sql.ENTRIES + " ORDER BY seq", runtime_id)
        entries = [sql.entry(*row) for row in rows]
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
    async def entries_after_event(self, runtime_id: str, after_event: int, limit: int | None = None) -> list[Entry]:
        await self._settle()
        pool = await self.pool()
        if limit is None:
            rows = await pool.fetch(sql.ENTRIES + " AND last_event > $2 ORDER BY seq", runtime_id, after_event)
        else:
            # In the order of journal_by_event (the order of seq, as a journal's last events
            # never go down): a page starts where its first row is, not at the journal's start.
            query = sql.ENTRIES + " AND last_event > $2 ORDER BY last_event, seq LIMIT $3"
            rows = await pool.fetch(query, runtime_id, after_event, limit)
        return [sql.entry(*row) for row in rows]

    @guarded
    async def list_runtimes(self, tenant: str, after: tuple[float, str] | None, limit: int) -> list[RuntimeRow]:
        await self._settle()
        pool = await self.pool()
        # COLLATE "C": ids order by their bytes, as in SQLite, whatever the database's locale.
        query = (
            "SELECT id, tenant, created_at, handles, running_handles, suspended_handles, tokens, cost_micros, cost_currency,"
            " cost_priced FROM runtimes WHERE tenant = $1"
            + (' AND (created_at < $2 OR (created_at = $2 AND id COLLATE "C" < $3))' if after else "")
            + f' ORDER BY created_at DESC, id COLLATE "C" DESC LIMIT ${4 if after else 2}'
        )
        parameters = (tenant, after[0], after[1], limit) if after else (tenant, limit)
        return [RuntimeRow(row[0], row[1], row[2], RuntimeCounts(*row[3:])) for row in await pool.fetch(query, *parameters)]

    @guarded
    async def idle_runtimes(self, before: float | None, suspended_before: float | None = None) -> list[str]:
        await self._settle()
        pool = await self.pool()
        mine = self.leasing.replica_id if self.leasing is not None else ""
        query = f'SELECT r.id FROM runtimes r WHERE {sql.IDLE} ORDER BY r.updated_at, r.id COLLATE "C"'
        rows = await pool.fetch(query, before, suspended_before, mine)
        return [row[0] for row in rows]

    @guarded
    async def delete_if_idle(self, runtime_id: str, before: float | None, suspended_before: float | None = None) -> bool:
        await self._settle()  # an append still buffered is a write: it moves updated_at first
        pool = await self.pool()
        mine = self.leasing.replica_id if self.leasing is not None else ""
        # One statement: a commit or a claim of the runtime that lands first holds its row
        # lock, and the DELETE checks the row again as that left it.
        deleted = await pool.fetchval(sql.DELETE_IF_IDLE, before, suspended_before, mine, runtime_id)
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

    @guarded
    async def runtimes_with_running_handles(self) -> list[str]:
        await self._settle()
        pool = await self.pool()
        return [row[0] for row in await pool.fetch('SELECT id FROM runtimes WHERE running ORDER BY id COLLATE "C"')]

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


async def _keep(connection: Any, reply: TenantReply | None) -> None:
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
