"""The service benchmark: the bench workload driven over gRPC against a real server process.

Workload: each root is a coordinator that delegates to 4 workers in one turn; each worker
calls an http tool (with an input schema, checked on every call) 3 times, then answers;
the coordinator answers (18 model turns per root). The model is a stateless
OpenAI-compatible server in its own process (keep-alive, replying at once or after a fixed
latency); the tool is a loopback HTTP endpoint; the store is a fresh SQLite file. C roots
are kept in flight.

Prints: model turns/s, root p50/p99, server CPU per turn, peak RSS, for each (C, latency),
and a floor row: the same HTTP calls (18 model calls and 12 tool calls a root, in the same
order) from a bare keep-alive client, with that client's CPU per model turn.
Figures are medians over batches; they are measured, never asserted."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from aiohttp import web
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

WORKERS = 4
TOOL_CALLS = 3
TURNS_PER_ROOT = 2 + WORKERS * (TOOL_CALLS + 1)
LOOKUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}},
    "required": ["n"],
    "additionalProperties": False,
}


def _reply(body: dict) -> dict:  # type: ignore[type-arg]
    results = sum(1 for message in body["messages"] if message["role"] == "tool")
    calls: list[tuple[str, dict[str, object]]] = []
    text = ""
    if body["model"] == "coordinator":
        if results == 0:
            calls = [("task", {"agent": "worker", "prompt": f"part {i}"}) for i in range(WORKERS)]
        else:
            text = "merged"
    elif results < TOOL_CALLS:
        calls = [("lookup", {"n": results})]
    else:
        text = "done"
    message: dict[str, object] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(calls)
        ]
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50},
    }


def _model_server(port: int, latency: float) -> None:
    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        if latency:
            await asyncio.sleep(latency)
        return web.Response(text=json.dumps(_reply(body)), content_type="application/json")

    serve_model(port, complete)


def serve_model(port: int, complete: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
    """A bench model server on `port`: `complete` answers chat completions; `/lookup` is the tool."""

    async def lookup(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="42")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/lookup", lookup)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def summary(rates: Sequence[float], cpu_per_turn: Sequence[float], latencies: Sequence[float]) -> dict[str, float]:
    """Medians over the batches, and the roots' p50 / p99."""
    ordered = sorted(latencies)
    return {
        "turns_per_s": statistics.median(rates),
        "p50_ms": ordered[len(ordered) // 2] * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "cpu_us_per_turn": statistics.median(cpu_per_turn) * 1e6,
    }


def server_env(folder: str, model_port: int, **settings: str) -> dict[str, str]:
    """A bench server's environment: a fresh SQLite store in `folder`, the model server, quiet logs."""
    return {
        **os.environ,
        "AGENTRUNTIME_STORE": f"sqlite:///{folder}/bench.db",
        "AGENTRUNTIME_LLM_STYLE": "openai",
        "AGENTRUNTIME_LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "AGENTRUNTIME_LOG_LEVEL": "WARNING",
        "AGENTRUNTIME_METRICS_LISTEN": "off",
        **settings,
    }


async def _wait_healthy(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        for _ in range(300):
            try:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)
    raise RuntimeError("the server did not start")


def _agents(model_port: int, worker: bool = False) -> list[pb.AgentDef]:
    # A tool's arguments are checked against its input schema on every call, as a real tool's are.
    schema = struct_pb2.Struct()
    schema.update(LOOKUP_SCHEMA)
    if worker:
        lookup = pb.ToolDef(
            name="lookup", description="look a number up", input_schema=schema, worker=pb.WorkerTool(queue="bench")
        )
    else:
        lookup = pb.ToolDef(
            name="lookup",
            description="look a number up",
            input_schema=schema,
            http=pb.HttpTool(url=f"http://127.0.0.1:{model_port}/lookup"),
        )
    return [
        pb.AgentDef(name="coordinator", model="coordinator", team=["worker"], description="coordinates"),
        pb.AgentDef(name="worker", model="worker", tools=[lookup], description="works"),
    ]


def _worker_process(address: str) -> None:
    """A host serving the lookup tool over ServeTools (the worker-tool variant)."""
    from agentruntime.client import Client

    async def serve() -> None:
        async with Client(address) as client:
            await client.serve_tools("bench", {"lookup": lambda arguments, call: "42"}, max_concurrent_calls=200)

    asyncio.run(serve())


async def service_run(
    concurrency: int,
    latency: float,
    roots: int,
    batches: int,
    worker: bool = False,
    on_server: Callable[[int], None] | None = None,
    python: str = sys.executable,
    request_ids: bool = False,
    per_root: bool = False,
    quiet: bool = True,
) -> dict[str, float]:
    """The workload's figures; `on_server` is told the server's pid once it serves (a profiler);
    `python` runs the server (another release's interpreter, for a baseline); `request_ids`:
    Spawn and Wake carry one each, as every client sends them; `per_root`: each root in a
    runtime of its own (CreateRuntime, then Spawn, Wake, Wait: how hosts use it, and how
    ../shared/bench-floor measures); `quiet=False`: the server's default logs and metrics."""
    model_port, server_port = _free_port(), _free_port()
    model = multiprocessing.Process(target=_model_server, args=(model_port, latency), daemon=True)
    model.start()
    with tempfile.TemporaryDirectory() as folder:
        env = server_env(folder, model_port)
        if not quiet:
            del env["AGENTRUNTIME_LOG_LEVEL"]
            env["AGENTRUNTIME_METRICS_LISTEN"] = f"127.0.0.1:{_free_port()}"  # on, as by default, on a free port
        address = f"127.0.0.1:{server_port}"
        server = await asyncio.create_subprocess_exec(python, "-m", "agentruntime_server", "serve", "--listen", address, env=env)
        host: multiprocessing.Process | None = None
        try:
            await _wait_healthy(address)
            if on_server is not None:
                on_server(server.pid)
            if worker:
                host = multiprocessing.Process(target=_worker_process, args=(address,), daemon=True)
                host.start()
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.AgentRuntimeStub(channel)
                agents = _agents(model_port, worker)
                runtime_id = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=agents))).runtime_id
                latencies: list[float] = []

                async def root() -> None:
                    started = time.perf_counter()
                    spawn_id, wake_id = (str(uuid.uuid4()), str(uuid.uuid4())) if request_ids else ("", "")
                    runtime = runtime_id
                    if per_root:
                        runtime = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=agents))).runtime_id
                    spawn = pb.SpawnRequest(runtime_id=runtime, agent="coordinator", request_id=spawn_id)
                    handle = (await stub.Spawn(spawn)).handle_id
                    await stub.Wake(pb.WakeRequest(runtime_id=runtime, handle_id=handle, prompt="go", request_id=wake_id))
                    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime, handle_id=handle))).result
                    if result.status != pb.STATUS_DONE or result.total_tokens != 50 * TURNS_PER_ROOT:
                        raise RuntimeError(f"unexpected result: {result}")
                    latencies.append(time.perf_counter() - started)

                async def batch() -> tuple[float, float]:
                    gate = asyncio.Semaphore(concurrency)

                    async def gated() -> None:
                        async with gate:
                            await root()

                    cpu_before, started = _proc_cpu_seconds(server.pid), time.perf_counter()
                    await asyncio.gather(*(gated() for _ in range(roots)))
                    elapsed = time.perf_counter() - started
                    return roots * TURNS_PER_ROOT / elapsed, (_proc_cpu_seconds(server.pid) - cpu_before) / (
                        roots * TURNS_PER_ROOT
                    )

                await batch()  # warm-up
                latencies.clear()
                rates, cpu = zip(*[await batch() for _ in range(batches)], strict=True)
                return {**summary(rates, cpu, latencies), "peak_rss_mb": _peak_rss_mb(server.pid)}
        finally:
            if host is not None:
                host.terminate()
                host.join()
            server.terminate()
            await server.wait()
            model.terminate()
            model.join()


async def floor_run(concurrency: int, latency: float, roots: int, batches: int) -> dict[str, float]:
    """The workload's HTTP calls, in its shape (a coordinator call; 4 workers side by side,
    each a model call, then a tool call, 3 times, then a last model call; a coordinator
    call), from a bare keep-alive client: no runtime. Its CPU is this process's."""
    port = _free_port()
    model = multiprocessing.Process(target=_model_server, args=(port, latency), daemon=True)
    model.start()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    lookup_url = f"http://127.0.0.1:{port}/lookup"
    body = json.dumps({"model": "worker", "messages": [{"role": "user", "content": "go"}]})
    headers = {"Content-Type": "application/json"}
    try:
        connector = aiohttp.TCPConnector(limit=concurrency * WORKERS)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def call() -> None:
                async with session.post(url, data=body, headers=headers) as response:
                    json.loads(await response.read())

            async def lookup() -> None:
                async with session.post(lookup_url, data=b'{"n": 0}', headers=headers) as response:
                    await response.read()

            async def chain() -> None:
                for _ in range(TOOL_CALLS):
                    await call()
                    await lookup()
                await call()

            async def root() -> None:
                await call()
                await asyncio.gather(*(chain() for _ in range(WORKERS)))
                await call()

            for _ in range(200):
                try:
                    await call()
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)

            gate = asyncio.Semaphore(concurrency)

            async def gated() -> None:
                async with gate:
                    await root()

            rates, cpu = [], []
            for _ in range(batches + 1):
                cpu_before, started = time.process_time(), time.perf_counter()
                await asyncio.gather(*(gated() for _ in range(roots)))
                rates.append(roots * TURNS_PER_ROOT / (time.perf_counter() - started))
                cpu.append((time.process_time() - cpu_before) / (roots * TURNS_PER_ROOT))
            return {"turns_per_s": statistics.median(rates[1:]), "cpu_us_per_turn": statistics.median(cpu[1:]) * 1e6}
    finally:
        model.terminate()
        model.join()


async def baseline(python: str, runs: int, roots: int, batches: int) -> None:
    """This server and another release's (its interpreter `python`), alternating, at C=20 with no
    model latency: each one's median CPU per model turn and turns/s, and the ratio of the two."""
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(runs):
        ours.append(await service_run(20, 0.0, roots, batches))
        theirs.append(await service_run(20, 0.0, roots, batches, python=python))
    mine, base = (statistics.median(run["cpu_us_per_turn"] for run in side) for side in (ours, theirs))
    print(f"{'runner':<34} {'C':>3} {'latency':>8} {'turns/s':>9} {'CPU/turn':>10}  (medians of {runs} alternating runs)")
    for name, side in (("agentruntime (this tree)", ours), (f"baseline ({python})", theirs)):
        rate = statistics.median(run["turns_per_s"] for run in side)
        cpu = statistics.median(run["cpu_us_per_turn"] for run in side)
        print(f"{name[:34]:<34} {20:>3} {0:>6.0f}ms {rate:>9,.0f} {cpu:>8.0f}µs")
    print(f"{'':<34} this tree's CPU per turn is {mine / base:.2f}x the baseline's")


async def request_id_cost(runs: int, roots: int, batches: int) -> None:
    """CPU per model turn with and without request ids on Spawn and Wake, alternating, at C=20
    with no model latency (issue #29: the aim is under 5 % more)."""
    without: list[float] = []
    with_ids: list[float] = []
    for _ in range(runs):
        without.append((await service_run(20, 0.0, roots, batches))["cpu_us_per_turn"])
        with_ids.append((await service_run(20, 0.0, roots, batches, request_ids=True))["cpu_us_per_turn"])
    plain, keyed = statistics.median(without), statistics.median(with_ids)
    pairs = ", ".join(f"{b / a:.2f}" for a, b in zip(without, with_ids, strict=True))
    print(
        f"{'request ids (Spawn, Wake)':<34} {20:>3} {0:>6.0f}ms without {plain:.0f}µs, with {keyed:.0f}µs CPU/turn: "
        f"{keyed / plain - 1:+.1%} (medians of {runs} alternating runs; pairs {pairs})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--roots", type=int, default=50, help="roots per batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument(
        "--baseline-python",
        help="another release's interpreter (`make bench-baseline` makes release 0.1.0's): compare CPU per turn with it",
    )
    parser.add_argument("--runs", type=int, default=5, help="alternating runs of each side, with --baseline-python")
    parser.add_argument("--request-ids", action="store_true", help="only the cost of request ids (alternating runs)")
    args = parser.parse_args()
    if args.request_ids:
        await request_id_cost(args.runs, args.roots, args.batches)
        return
    if args.baseline_python:
        await baseline(args.baseline_python, args.runs, args.roots, args.batches)
        return
    print(
        f"{'runner':<34} {'C':>3} {'latency':>8} {'turns/s':>9} {'root p50':>9} {'root p99':>9} {'CPU/turn':>10} {'peak RSS':>9}"
    )
    for concurrency, latency in ((1, 0.0), (20, 0.0), (1, 0.02), (20, 0.02)):
        roots = args.roots if concurrency > 1 else max(args.roots // 5, 5)
        figures = await service_run(concurrency, latency, roots, args.batches)
        floor = await floor_run(concurrency, latency, roots, args.batches)
        print(
            f"{'agentruntime (gRPC, SQLite)':<34} {concurrency:>3} {latency * 1000:>6.0f}ms {figures['turns_per_s']:>9,.0f} "
            f"{figures['p50_ms']:>7.0f}ms {figures['p99_ms']:>7.0f}ms {figures['cpu_us_per_turn']:>8.0f}µs "
            f"{figures['peak_rss_mb']:>7.0f}MB"
        )
        print(
            f"{'floor (bare keep-alive client)':<34} {concurrency:>3} {latency * 1000:>6.0f}ms {floor['turns_per_s']:>9,.0f} "
            f"{'':>9} {'':>9} {floor['cpu_us_per_turn']:>8.0f}µs"
        )
        print(
            f"{'':<34} {'':>3} {'':>8} {figures['turns_per_s'] / floor['turns_per_s']:>8.0%} of the floor, "
            f"{figures['cpu_us_per_turn'] / floor['cpu_us_per_turn']:.1f}x its CPU per turn"
        )
    await request_id_cost(3, args.roots, args.batches)
    # The same workload with the lookup tool served by a worker over ServeTools instead of HTTP.
    for concurrency, latency in ((20, 0.0), (20, 0.02)):
        figures = await service_run(concurrency, latency, args.roots, args.batches, worker=True)
        print(
            f"{'agentruntime (worker tool)':<34} {concurrency:>3} {latency * 1000:>6.0f}ms {figures['turns_per_s']:>9,.0f} "
            f"{figures['p50_ms']:>7.0f}ms {figures['p99_ms']:>7.0f}ms {figures['cpu_us_per_turn']:>8.0f}µs "
            f"{figures['peak_rss_mb']:>7.0f}MB"
        )


if __name__ == "__main__":
    asyncio.run(main())
