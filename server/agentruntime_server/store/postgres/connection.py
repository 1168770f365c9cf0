"""A PostgreSQL store's connections: the pool (connected, and the schema migrated, on first
use), the one kept connection commits go through, and the database's weather: a statement
that loses its database makes the store unavailable until a probe reaches it again
(every PROBE_EVERY seconds); the health callbacks say so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ...domain.errors import StoreUnavailable
from ..urls import redacted
from .migrations import migrate
from .weather import PROBE_EVERY, PROBE_TIMEOUT, WEATHER

log = logging.getLogger("agentruntime_server.store.postgres")  # the store's log, named as before its split


class PostgresConnection:
    """The connections and the database's weather (the first layer of PostgresStore)."""

    def __init__(self, url: str, *, schema: str | None = None, pool_size: int = 10) -> None:
        """`schema`: the tables live in this schema (created if missing) rather than the
        connection's default one (tests: one schema a test)."""
        self._url = url
        self._schema = schema
        self._pool_size = pool_size
        self._pool: Any = None
        self._connecting = asyncio.Lock()
        self._writer_connection: Any = None
        # The database went away: set until a probe reaches it again (`_probing`).
        self._down: BaseException | None = None
        self._probing: asyncio.Task[None] | None = None
        self._on_health: list[Callable[[bool], None]] = []

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
                        self._url,
                        min_size=1,
                        max_size=self._pool_size,
                        server_settings=self._settings(),
                        reset=_session_kept,
                    )
                    try:
                        async with pool.acquire() as connection:
                            await migrate(connection, self._schema)
                    except BaseException:
                        await pool.close()
                        raise
                    self._pool = pool
        return self._pool

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

    @property
    def available(self) -> bool:
        return self._down is None

    def raise_if_away(self) -> None:
        """StoreUnavailable while the database is away."""
        if self._down is not None:
            raise self._refusal()

    async def _writer(self) -> Any:
        """The connection commits go through: one, kept (commits run one at a time anyway,
        and a pool's release would cost a round trip of its own each time). Its own, not the
        pool's: a pool takes back a connection the server ended, under its holder, and may
        hand it out again while the holder still has it."""
        if self._writer_connection is None:
            await self.pool()  # connected and migrated first
            self._writer_connection = await asyncpg.connect(self._url, server_settings=self._settings(), timeout=PROBE_TIMEOUT)
        return self._writer_connection


async def _session_kept(connection: Any) -> None:
    """What a connection going back to the pool needs beyond asyncpg's own rollback of a
    transaction left open: nothing. The store takes only transaction-scoped advisory locks,
    listens to nothing and sets no session setting (its search_path is a startup setting), so
    asyncpg's default reset (advisory locks, cursors, LISTEN, RESET ALL) would be a round trip
    a release for nothing: measured 64 % of the statements a replica sent (bench/capacity.py)."""
