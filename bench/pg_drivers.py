"""asyncpg against psycopg 3 on the journal's write pattern (issue 13: which driver, and why).

The pattern is PostgresStore's: commits one after another over one kept connection, each
one statement (store/postgres/statements.py `COMMIT`) carrying a tick's journal rows for several
runtimes as arrays, with the fencing check, the runtime updates and the tenants' tokens;
and a runtime's whole journal read back (a restore). Both drivers run the same SQL on an
embedded PostgreSQL, asynchronously, with binary parameters and a prepared statement.

Prints commits/s and the client's CPU per commit, and loads/s for a 200-entry journal.
Measured, never asserted."""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from agentruntime_server.store.postgres import PostgresStore
from agentruntime_server.store.postgres.statements import COMMIT, ENTRIES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.postgres import embedded_postgres, fresh_database

RUNTIMES_PER_COMMIT = 4
ROWS_PER_RUNTIME = 3
STEP = (
    b'{"v":3,"k":"ModelReplied","d":{"handle_id":"root/coordinator.1","message":{"role":"assistant","content":"'
    + b"x" * 300
    + b'"}}}'
)
COMMITS = 2000
LOADED_ENTRIES = 200


def _arguments(commit: int) -> list[Any]:
    keys = [f"rt-{n}" for n in range(RUNTIMES_PER_COMMIT)]
    rows = [(key, commit * ROWS_PER_RUNTIME + r + 1, time.time(), 0, 0, STEP) for key in keys for r in range(ROWS_PER_RUNTIME)]
    return [
        keys,
        [1] * len(keys),
        "bench",
        *[list(column) for column in zip(*rows, strict=True)],
        [True] * len(keys),
        [3] * len(keys),
        [1] * len(keys),
        [0] * len(keys),
        time.time(),
        ["default"],
        [commit],
        [10],
    ]


async def _prepare(url: str) -> None:
    store = PostgresStore(url)
    try:
        pool = await store.pool()  # migrates
        for n in range(RUNTIMES_PER_COMMIT):
            await pool.execute(
                "INSERT INTO runtimes (id, agents, created_at, updated_at, owner, epoch) VALUES ($1, '[]', 0, 0, 'bench', 1)",
                f"rt-{n}",
            )
    finally:
        await store.close()


async def asyncpg_run(url: str) -> tuple[float, float, float]:
    import asyncpg  # type: ignore[import-untyped]

    connection = await asyncpg.connect(url)
    try:
        return await _measure(
            lambda commit: connection.fetch(COMMIT, *_arguments(commit)),
            lambda: connection.fetch(ENTRIES + " ORDER BY seq LIMIT $2", "rt-0", LOADED_ENTRIES),
        )
    finally:
        await connection.close()


async def psycopg_run(url: str) -> tuple[float, float, float]:
    import psycopg

    commit_sql = re.sub(r"\$(\d+)", r"%(p\1)s", COMMIT)
    entries_sql = re.sub(r"\$(\d+)", r"%(p\1)s", ENTRIES + " ORDER BY seq LIMIT $2")
    connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:

        async def commit(n: int) -> Any:
            parameters = {f"p{i + 1}": value for i, value in enumerate(_arguments(n))}
            cursor = await connection.execute(commit_sql, parameters, prepare=True, binary=True)
            return await cursor.fetchall()

        async def load() -> Any:
            cursor = await connection.execute(entries_sql, {"p1": "rt-0", "p2": LOADED_ENTRIES}, prepare=True, binary=True)
            return await cursor.fetchall()

        return await _measure(commit, load)
    finally:
        await connection.close()


async def _measure(commit: Any, load: Any) -> tuple[float, float, float]:
    rates, cpus = [], []
    for batch in range(4):  # the first is a warm-up
        base = 10_000_000 * (batch + 1) + int(time.time() * 1000) % 1_000_000 * 10
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(COMMITS // 4):
            await commit(base + n)
        if batch:
            rates.append((COMMITS // 4) / (time.perf_counter() - wall))
            cpus.append((time.process_time() - cpu) / (COMMITS // 4))
    started = time.perf_counter()
    for _ in range(200):
        await load()
    return statistics.median(rates), statistics.median(cpus), 200 / (time.perf_counter() - started)


async def main() -> None:
    print(f"{'driver (one commit at a time)':<32} {'commits/s':>10} {'CPU/commit':>11} {'loads/s (200 entries)':>22}")
    with embedded_postgres("agentruntime-bench-pg-") as url:
        for name, run in (("asyncpg 0.32", asyncpg_run), ("psycopg 3.3 (binary, prepared)", psycopg_run)):
            database = await fresh_database(url, name.split()[0])
            await _prepare(database)
            rate, cpu, loads = await run(database)
            print(f"{name:<32} {rate:>10,.0f} {cpu * 1e6:>9.0f}µs {loads:>22,.0f}")


if __name__ == "__main__":
    asyncio.run(main())
