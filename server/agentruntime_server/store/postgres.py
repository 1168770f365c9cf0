"""`postgresql://user:password@host:port/db`: the store on PostgreSQL (asyncpg, one pool).

The same logical tables and the same semantics as SqliteStore (store/sqlite.py): a runtime
is a row of definitions plus its journal, one row per step, appended in order; an append is
checked (its seqs) and encoded when it is made, all or nothing, and buffered; the rows every
runtime appended in one event-loop tick are written in one transaction by a commit task
started when the tick ends; `flush` awaits that commit, and a commit that failed leaves the
store broken (every later flush and read raises: nothing is acknowledged after it).

asyncpg is asynchronous, so commits overlap the event loop: they run one after another,
each after the one before it has finished. Reads first await every commit of what was
appended before them (a store reads its own writes). The pool connects, and the schema is
migrated, on first use: opening a store (app.open_store) is synchronous.

The URL's password is a secret: it is never logged, and `redacted(url)` is what may be."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from pydantic import TypeAdapter

from ..domain.journal import Entry
from ..domain.model import AgentSpec
from ..domain.ports import RuntimeRow, StoredRuntime
from . import payloads
from .payloads import Row, journal_rows
from .pg_migrations import migrate
from .urls import redacted

_AGENTS = TypeAdapter(tuple[AgentSpec, ...])
_APPEND = "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step) VALUES ($1, $2, $3, $4, $5, $6)"
_ENTRIES = "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = $1"


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a failed commit nobody flushed is not "never retrieved"


class _Batch:
    """What one tick appended, by every runtime, and the commit that writes it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.rows: list[Row] = []
        self.running: dict[str, bool] = {}
        self.counts: dict[str, tuple[int, int, int]] = {}
        self.touched: set[str] = set()  # runtimes written: their updated_at moves
        self.tokens: dict[tuple[str, int], int] = {}  # (tenant, minute) -> tokens
        self.done: asyncio.Future[None] = loop.create_future()
        self.done.add_done_callback(_retrieved)


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
        self._open: _Batch | None = None  # appended, not yet handed to a commit
        self._cut_due = False
        self._last: asyncio.Future[None] | None = None  # the latest commit's outcome
        self._writing: set[asyncio.Task[None]] = set()
        # A commit that failed: nothing is acknowledged after it, ever.
        self._broken: BaseException | None = None
        self._next_seq: dict[str, int] = {}  # per runtime: the seq its next entry must have

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self._url)!r})"

    async def _connected(self) -> Any:
        if self._pool is None:
            async with self._connecting:
                if self._pool is None:
                    settings = {"application_name": "agentruntime"}
                    if self._schema is not None:
                        settings["search_path"] = self._schema
                    pool = await asyncpg.create_pool(self._url, min_size=1, max_size=self._pool_size, server_settings=settings)
                    try:
                        async with pool.acquire() as connection:
                            await migrate(connection, self._schema)
                    except BaseException:
                        await pool.close()
                        raise
                    self._pool = pool
        return self._pool

    # ---- group commit --------------------------------------------------------------------

    def _batch(self) -> _Batch:
        if self._open is None:
            self._open = _Batch(asyncio.get_running_loop())
        if not self._cut_due:
            self._cut_due = True
            asyncio.get_running_loop().call_soon(self._cut)
        return self._open

    def _cut(self) -> None:
        """Hands the open batch to a commit, which starts once the commit before it ends."""
        self._cut_due = False
        batch, self._open = self._open, None
        if batch is None:
            return
        previous, self._last = self._last, batch.done
        task = asyncio.get_running_loop().create_task(self._commit(batch, previous))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _commit(self, batch: _Batch, previous: asyncio.Future[None] | None) -> None:
        if previous is not None and not previous.done():
            await asyncio.wait([previous])
        try:
            if self._broken is not None:
                raise self._broken
            pool = await self._connected()
            now = time.time()
            async with pool.acquire() as connection, connection.transaction():
                if batch.rows:
                    await connection.executemany(_APPEND, batch.rows)
                if batch.running:
                    await connection.executemany(
                        "UPDATE runtimes SET running = $1 WHERE id = $2", [(v, k) for k, v in batch.running.items()]
                    )
                if batch.counts:
                    await connection.executemany(
                        "UPDATE runtimes SET handles = $1, running_handles = $2, suspended_handles = $3 WHERE id = $4",
                        [(*value, key) for key, value in batch.counts.items()],
                    )
                if batch.touched:
                    await connection.execute(
                        "UPDATE runtimes SET updated_at = $1 WHERE id = ANY($2::text[])", now, sorted(batch.touched)
                    )
                if batch.tokens:
                    await connection.executemany(
                        "INSERT INTO tenant_tokens (tenant, minute, tokens) VALUES ($1, $2, $3) "
                        "ON CONFLICT (tenant, minute) DO UPDATE SET tokens = tenant_tokens.tokens + excluded.tokens",
                        [(tenant, minute, value) for (tenant, minute), value in batch.tokens.items()],
                    )
        except BaseException as exc:
            if self._broken is None:
                self._broken = RuntimeError(f"the store could not commit ({type(exc).__name__}: {exc}); restart the server")
            batch.done.set_exception(self._broken)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        batch.done.set_result(None)

    async def _settle(self) -> None:
        """Every entry appended so far is committed (reads see them)."""
        if self._broken is not None:
            raise self._broken
        if self._open is not None:
            self._cut()
        if self._last is not None:
            await asyncio.shield(self._last)

    async def flush(self) -> None:
        if self._broken is not None:
            raise self._broken
        if self._open is not None:  # committed when the tick ends, with the rest of the tick
            waited = self._open.done
        elif self._last is not None:
            waited = self._last
        else:
            return
        await asyncio.shield(waited)

    # ---- writes --------------------------------------------------------------------------

    async def create_runtime(self, runtime_id: str, agents: tuple[AgentSpec, ...], tenant: str = "default") -> None:
        pool = await self._connected()
        now = time.time()
        await pool.execute(  # its own transaction: a runtime is created once, and acknowledged at once
            "INSERT INTO runtimes (id, agents, created_at, tenant, updated_at) VALUES ($1, $2, $3, $4, $5)",
            runtime_id,
            _AGENTS.dump_json(agents).decode(),
            now,
            tenant,
            now,
        )
        self._next_seq[runtime_id] = 1  # so that append never awaits: the journal assigns seqs in order

    async def runtime_exists(self, runtime_id: str) -> bool:
        await self._settle()
        pool = await self._connected()
        return await pool.fetchval("SELECT 1 FROM runtimes WHERE id = $1", runtime_id) is not None

    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: tuple[int, int, int] | None = None,
    ) -> None:
        if runtime_id not in self._next_seq:
            pool = await self._connected()
            async with pool.acquire() as connection:
                if await connection.fetchval("SELECT 1 FROM runtimes WHERE id = $1", runtime_id) is None:
                    raise KeyError(f"no runtime {runtime_id!r} to append to")
                last = await connection.fetchval("SELECT MAX(seq) FROM journal WHERE runtime_id = $1", runtime_id)
            self._next_seq.setdefault(runtime_id, (last or 0) + 1)  # another append may have come first
        # From here on no await: checked, encoded and buffered at once, all or nothing, so that
        # nothing that reaches the tick's commit can fail.
        rows, self._next_seq[runtime_id] = journal_rows(runtime_id, self._next_seq[runtime_id], entries)
        batch = self._batch()
        batch.rows.extend(rows)
        if running is not None:
            batch.running[runtime_id] = running
        if counts is not None:
            batch.counts[runtime_id] = counts
        batch.touched.add(runtime_id)

    async def delete_runtime(self, runtime_id: str) -> None:
        await self._settle()
        pool = await self._connected()
        async with pool.acquire() as connection, connection.transaction():
            await connection.execute("DELETE FROM journal WHERE runtime_id = $1", runtime_id)
            await connection.execute("DELETE FROM runtimes WHERE id = $1", runtime_id)
        self._next_seq.pop(runtime_id, None)

    async def add_tokens(self, tenant: str, minute: int, tokens: int) -> None:
        batch = self._batch()
        batch.tokens[(tenant, minute)] = batch.tokens.get((tenant, minute), 0) + tokens

    # ---- reads ---------------------------------------------------------------------------

    async def load(self, runtime_id: str) -> StoredRuntime | None:
        await self._settle()
        pool = await self._connected()
        async with pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
            agents = await connection.fetchval("SELECT agents FROM runtimes WHERE id = $1", runtime_id)
            if agents is None:
                return None
            rows = await connection.fetch(_ENTRIES + " ORDER BY seq", runtime_id)
        entries = [_entry(*row) for row in rows]
        # Appends of this runtime follow from here without an await (two could race otherwise).
        self._next_seq.setdefault(runtime_id, (entries[-1].seq if entries else 0) + 1)
        return StoredRuntime(_AGENTS.validate_json(agents), entries)

    async def entries_after_event(self, runtime_id: str, after_event: int) -> list[Entry]:
        await self._settle()
        pool = await self._connected()
        rows = await pool.fetch(_ENTRIES + " AND last_event > $2 ORDER BY seq", runtime_id, after_event)
        return [_entry(*row) for row in rows]

    async def list_runtimes(self, tenant: str, after: tuple[float, str] | None, limit: int) -> list[RuntimeRow]:
        await self._settle()
        pool = await self._connected()
        # COLLATE "C": ids order by their bytes, as in SQLite, whatever the database's locale.
        query = (
            "SELECT id, tenant, created_at, handles, running_handles, suspended_handles FROM runtimes WHERE tenant = $1"
            + (' AND (created_at < $2 OR (created_at = $2 AND id COLLATE "C" < $3))' if after else "")
            + f' ORDER BY created_at DESC, id COLLATE "C" DESC LIMIT ${4 if after else 2}'
        )
        parameters = (tenant, after[0], after[1], limit) if after else (tenant, limit)
        return [RuntimeRow(*row) for row in await pool.fetch(query, *parameters)]

    async def idle_runtimes(self, before: float) -> list[str]:
        await self._settle()
        pool = await self._connected()
        rows = await pool.fetch(
            'SELECT id FROM runtimes WHERE updated_at < $1 AND NOT running ORDER BY updated_at, id COLLATE "C"', before
        )
        return [row[0] for row in rows]

    async def count_runtimes(self, tenant: str) -> int:
        await self._settle()
        pool = await self._connected()
        count: int = await pool.fetchval("SELECT COUNT(*) FROM runtimes WHERE tenant = $1", tenant)
        return count

    async def tokens_since(self, tenant: str, minute: int) -> list[tuple[int, int]]:
        await self._settle()
        pool = await self._connected()
        rows = await pool.fetch(
            "SELECT minute, tokens FROM tenant_tokens WHERE tenant = $1 AND minute >= $2 ORDER BY minute", tenant, minute
        )
        return [(int(at), int(tokens)) for at, tokens in rows]

    async def runtimes_with_running_handles(self) -> list[str]:
        await self._settle()
        pool = await self._connected()
        return [row[0] for row in await pool.fetch('SELECT id FROM runtimes WHERE running ORDER BY id COLLATE "C"')]

    async def close(self) -> None:
        try:
            await self._settle()
        finally:
            if self._writing:
                await asyncio.wait(list(self._writing))
            if self._pool is not None:
                pool, self._pool = self._pool, None
                await pool.close()


def _entry(seq: int, at: float, first_event: int, last_event: int, step: bytes) -> Entry:
    return Entry(seq, at, first_event, last_event - first_event + 1, payloads.decode(step))
