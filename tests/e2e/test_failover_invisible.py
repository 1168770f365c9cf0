"""A failover no host ever sees (issue #29): three replicas on one PostgreSQL database, driven
by the Python client with its default options through one target naming all three (as a
load balancer would be). 30 roots go through a SIGKILL of the busiest owner, a SIGSTOP of
another past its lease, and a rolling SIGTERM of all three: no error reaches the caller,
every root's figures are exact, no handle ran twice and no message was posted twice.
Every mutating call carries the request id the client gave it, the same on every attempt."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from agentruntime.client import Client

from tests.support.jobs import HITS, assert_each_job_once, one_root, script
from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.process import ServerProcess
from tests.support.replicas import LEASE
from tests.support.tool_server import ToolServer

ROOTS = 30


@pytest.fixture
async def replicas(database: str, model: ScriptedModelServer, tmp_path: Path) -> AsyncIterator[list[ServerProcess]]:
    script(model)
    env = {"AGENTRUNTIME_LEASE_DURATION": str(LEASE), "AGENTRUNTIME_SHUTDOWN_GRACE": "5"}
    made = [ServerProcess(database, model.base_url, tmp_path / f"replica-{n}.log", env) for n in range(3)]
    for replica in made:
        await replica.start()
    yield made
    for replica in made:
        if replica.process is not None and replica.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                replica.process.send_signal(signal.SIGCONT)
            await replica.stop()


async def owners(database: str) -> Counter[str]:
    """How many runtimes each replica runs, by the address it serves on."""
    connection = await asyncpg.connect(database)
    try:
        rows = await connection.fetch("SELECT p.address FROM runtimes r JOIN replicas p ON p.id = r.owner")
    finally:
        await connection.close()
    return Counter(row[0] for row in rows)


async def test_thirty_roots_through_a_kill_a_pause_and_a_rolling_restart_see_no_error(
    replicas: list[ServerProcess], tools: ToolServer, database: str, model: ScriptedModelServer
) -> None:
    tools.delays["hit"] = 0.4
    target = "ipv4:" + ",".join(replica.address for replica in replicas)
    async with Client(target) as client:
        roots = [asyncio.ensure_future(one_root(client, tools, job)) for job in range(ROOTS)]
        await until(lambda: len(tools.keys) >= 20, "the roots' calls to be under way", timeout=60)

        # The owner of the most runtimes dies mid-run.
        busiest = (await owners(database)).most_common(1)[0][0]
        victim = next(n for n, replica in enumerate(replicas) if replica.address == busiest)
        replicas[victim].send(signal.SIGKILL)
        killed = replicas[victim].process
        assert killed is not None
        await killed.wait()
        await replicas[victim].start()

        # Another one stops past its lease, and wakes to find its runtimes moved.
        paused = (victim + 1) % 3
        replicas[paused].send(signal.SIGSTOP)
        await asyncio.sleep(LEASE * 2)
        replicas[paused].send(signal.SIGCONT)

        # A rolling restart: each replica drains (SIGTERM), gives its leases up and comes back.
        for n, replica in enumerate(replicas):
            assert await replica.stop(signal.SIGTERM) == 0, n
            await replica.start()

        settled = await asyncio.gather(*roots)  # any error a client call raised fails the test here

    await assert_each_job_once(target, settled, ROOTS)
    # The handles of each: the root and its two workers, no more.
    async with Client(target) as reader:
        for runtime_id, result in settled:
            handles = await reader.list_handles(runtime_id)
            assert sorted(h.handle_id for h in handles) == sorted(
                [result.handle_id, f"{result.handle_id}/worker.1", f"{result.handle_id}/worker.2"]
            )
    # Every worker call ran; one ran again only if it was in flight at a fault (same key).
    per_key = Counter(tools.keys)
    assert len(per_key) == ROOTS * 2 * HITS and max(per_key.values()) <= 2
    print(f"tool calls run twice (in flight at a fault): {sum(1 for n in per_key.values() if n == 2)} of {len(per_key)}")
