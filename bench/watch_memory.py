"""Watchers of a long history: the server's memory, and how long another tenant waits, while
watchers that never read hold Watch streams open from seq 0 (issue 41), and while watchers
read the whole history as the console's live pages do.

The runtime is tests/support/big_runtime.py's (3,081 handles, about 24,700 events), built once
on a SQLite file and served by a server process of its own (AUTH=tokens); RSS is read from
/proc. Another tenant (globex) calls ListRuntimes and the health check one after the other
all along; the figures are its slowest call and how many took over 100 ms. Figures are
measured, never asserted.

To measure another tree's server (an older commit, say), put its server/ first on the path:
`PYTHONPATH=/path/to/old/server .venv/bin/python bench/watch_memory.py`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentruntime_server.process.event_loop import DEFAULT_LOOP, loop_factory

from tests.support.big_runtime import build
from tests.support.process import ServerProcess
from tests.support.tenants import ACME_READER, GLOBEX, bearer


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Probe:
    """Globex's calls, one after the other, and the server's RSS, until stopped."""

    stub: pb_grpc.AgentRuntimeAsyncStub
    health: health_pb2_grpc.HealthStub
    pid: int
    waits: list[float] = field(default_factory=list)
    peak: float = 0.0

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            await self.stub.ListRuntimes(pb.ListRuntimesRequest(), metadata=bearer(GLOBEX[1]), timeout=60)
            await self.health.Check(health_pb2.HealthCheckRequest(), timeout=60)
            self.waits.append((time.perf_counter() - started) / 2)
            self.peak = max(self.peak, rss_mb(self.pid))
            await asyncio.sleep(0.02)

    def summary(self, baseline: float) -> str:
        slow = sum(1 for wait in self.waits if wait > 0.1)
        worst = max(self.waits, default=0.0)
        return (
            f"RSS {baseline:.0f} -> {self.peak:.0f} MB (+{self.peak - baseline:.0f} MB); globex's calls: "
            f"{len(self.waits)}, slowest {worst * 1000:.0f} ms, {slow} over 100 ms"
        )


@contextlib.asynccontextmanager
async def probing(stub: pb_grpc.AgentRuntimeAsyncStub, channel: grpc.aio.Channel, pid: int) -> AsyncIterator[Probe]:
    probe = Probe(stub, health_pb2_grpc.HealthStub(channel), pid)
    task = asyncio.ensure_future(probe.run())
    try:
        yield probe
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def idle_watchers(server: ServerProcess, stub: pb_grpc.AgentRuntimeAsyncStub, watchers: int, hold: float) -> None:
    assert server.process is not None and server.channel is not None
    pid = server.process.pid
    baseline = rss_mb(pid)
    async with grpc.aio.insecure_channel(server.address) as channel:
        reader = pb_grpc.AgentRuntimeStub(channel)
        async with probing(stub, server.channel, pid) as probe:
            started = time.perf_counter()
            calls = [reader.Watch(pb.WatchRequest(runtime_id="big"), metadata=bearer(ACME_READER[1])) for _ in range(watchers)]
            await asyncio.gather(*(call.initial_metadata() for call in calls))
            opened = time.perf_counter() - started
            await asyncio.sleep(hold)
        for call in calls:
            call.cancel()
    held = f"all sending after {opened:.1f} s, held {hold:.0f} s"
    print(f"{watchers} watchers from seq 0 that never read ({held}): {probe.summary(baseline)}")


async def reading_watchers(server: ServerProcess, stub: pb_grpc.AgentRuntimeAsyncStub, watchers: int, last: int) -> None:
    """As the console's live pages: Watch with deltas from 0, every event read."""
    assert server.process is not None and server.channel is not None
    pid = server.process.pid
    baseline = rss_mb(pid)
    async with grpc.aio.insecure_channel(server.address) as channel:
        reader = pb_grpc.AgentRuntimeStub(channel)

        async def read_all() -> int:
            call = reader.Watch(pb.WatchRequest(runtime_id="big", deltas=True), metadata=bearer(ACME_READER[1]))
            count = 0
            async for response in call:
                count += 1
                if response.event.seq == last:
                    break
            call.cancel()
            return count

        async with probing(stub, server.channel, pid) as probe:
            started = time.perf_counter()
            counts = await asyncio.gather(*(read_all() for _ in range(watchers)))
            took = time.perf_counter() - started
    assert counts == [last] * watchers, counts
    print(f"{watchers} watchers with deltas reading all {last:,} events ({took:.1f} s): {probe.summary(baseline)}")


@contextlib.asynccontextmanager
async def serving(folder: Path) -> AsyncIterator[tuple[ServerProcess, pb_grpc.AgentRuntimeAsyncStub]]:
    """A server process of its own on the built store, the runtime loaded (what any reader of
    it costs once, before a baseline is read)."""
    env = {"AGENTRUNTIME_AUTH": "tokens", "AGENTRUNTIME_AUTH_TOKENS_FILE": str(folder / "tokens.json")}
    server = ServerProcess(folder / "store.db", "http://127.0.0.1:9", folder / "server.log", env)
    stub = await server.start()
    assert server.process is not None
    try:
        first = stub.Watch(pb.WatchRequest(runtime_id="big"), metadata=bearer(ACME_READER[1]))
        loaded = await first.read()
        assert isinstance(loaded, pb.WatchResponse) and loaded.event.seq == 1
        first.cancel()
        print(f"  (a server process with the runtime loaded: {rss_mb(server.process.pid):.0f} MB)")
        yield server, stub
    finally:
        await server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--watchers", type=int, default=40)
    parser.add_argument("--readers", type=int, default=20)
    parser.add_argument("--hold", type=float, default=5.0, help="seconds the idle watchers stay open")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        handles, last = await build(Path(folder))
        print(f"runtime: {handles:,} handles, {last:,} events (built in {time.perf_counter() - started:.1f} s)")
        async with serving(Path(folder)) as (server, stub):
            await idle_watchers(server, stub, args.watchers, args.hold)
        async with serving(Path(folder)) as (server, stub):
            await reading_watchers(server, stub, args.readers, last)


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=loop_factory(DEFAULT_LOOP)) as runner:
        runner.run(main())
