"""Durability benchmark: journal write cost per turn, and the server's resident memory over
thousands of finished runtimes and with thousands of suspended handles.

The server runs as its own process on a fresh SQLite file with the embedded scripted
model (no HTTP model), driven over gRPC; RSS is read from /proc. Figures are measured,
never asserted."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentruntime_server.domain.billing.usage import Tokens
from agentruntime_server.domain.journal import (
    CallFinished,
    CallStarted,
    Journal,
    MessagesAppended,
    ModelReplied,
    RunStarted,
    Spawned,
    Tree,
    TurnStarted,
)
from agentruntime_server.domain.vocabulary import AgentSpec, Budget, Message, ToolCall, ToolResult
from agentruntime_server.domain.watching.event_log import EventLog
from agentruntime_server.store.sqlite import SqliteStore

from tests.support.process import free_port

FINISHER = pb.AgentDef(
    name="finisher", script=pb.Script(replies=[pb.ScriptedReply(text="done", tokens=10)]), instructions="Answer."
)
# A root that delegates: a lead hands one part to a worker through the task tool (two handles,
# a parent and its child). Its tree of handles was a reference cycle until issue 43: each root
# that left the cache waited for the collector's next full pass, 8 KB a root.
DELEGATING = (
    pb.AgentDef(
        name="lead",
        description="hands the part to a worker",
        team=["worker"],
        script=pb.Script(
            replies=[
                pb.ScriptedReply(
                    tool_calls=[pb.ScriptedToolCall(name="task", arguments_json='{"agent": "worker", "prompt": "part"}')],
                    tokens=10,
                ),
                pb.ScriptedReply(text="done", tokens=10),
            ]
        ),
    ),
    pb.AgentDef(
        name="worker", description="does the part", script=pb.Script(replies=[pb.ScriptedReply(text="part done", tokens=10)])
    ),
)
WAITER = pb.AgentDef(
    name="waiter",
    tools=[pb.ToolDef(name="approve", relay=pb.RelayTool())],
    script=pb.Script(
        replies=[pb.ScriptedReply(tool_calls=[pb.ScriptedToolCall(name="approve", arguments_json="{}")], tokens=10)]
    ),
)


async def journal_cost(turns: int, batches: int) -> float:
    """Median microseconds of the journal steps one tool-calling turn records: applied to the
    tree, encoded, appended to the store (with their events derived), and committed."""
    samples = []
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(str(Path(folder) / "journal.db"))
        agents = (AgentSpec(name="worker"),)
        await store.create_runtime("bench", agents)
        tree = Tree("bench", agents)

        async def nothing(after: int, limit: int) -> list:  # type: ignore[type-arg]
            return []

        journal = Journal(tree, store, EventLog("bench", nothing))
        await journal.record(
            Spawned("root/worker.1", "", "worker", Budget(), "", 1), RunStarted("root/worker.1", Message("user", "go"))
        )
        handle = tree.handles["root/worker.1"]
        for _ in range(batches):
            started = time.perf_counter()
            for _ in range(turns):
                turn = handle.usage.turns + 1
                call = ToolCall(f"call_{turn}_1", "ping", '{"n": 1}')
                reply = Message("assistant", "", (call,), turn=turn)
                await journal.record(TurnStarted(handle.id, turn))
                split = Tokens(input=30, output=20)
                await journal.record(ModelReplied(handle.id, reply, 50, handle.usage.after_reply(split), split=split))
                await journal.record(CallStarted(handle.id, call, effect=True))
                await store.flush()  # the call leaves the process next
                await journal.record(CallFinished(handle.id, call, ToolResult("pong #1")))
                await journal.record(MessagesAppended(handle.id, (Message("tool", "pong #1", tool_call_id=call.id),)))
                await store.flush()  # a real turn waits on the network in between: its writes commit
            samples.append((time.perf_counter() - started) / turns * 1e6)
        await store.close()
    return statistics.median(samples)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _serve(store: Path, cache: int) -> tuple[asyncio.subprocess.Process, str]:
    address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "AGENTRUNTIME_STORE": f"sqlite:///{store}",
        "AGENTRUNTIME_RUNTIME_CACHE": str(cache),
        "AGENTRUNTIME_METRICS_LISTEN": "off",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentruntime_server", "serve", "--listen", address, "--log-level", "WARNING", env=env
    )
    async with grpc.aio.insecure_channel(address) as channel:
        for _ in range(200):
            try:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)
    return process, address


async def memory(
    runtimes: int, agents: Sequence[pb.AgentDef], cache: int, concurrency: int = 50, parts: int = 5
) -> list[tuple[int, float]]:
    """RSS after each of `parts` equal parts of `runtimes` runtimes, each a root of the first
    agent run to its result."""
    with tempfile.TemporaryDirectory() as folder:
        process, address = await _serve(Path(folder) / "rss.db", cache)
        points = []
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.AgentRuntimeStub(channel)
                gate = asyncio.Semaphore(concurrency)

                async def one() -> None:
                    async with gate:
                        runtime_id = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=agents))).runtime_id
                        handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent=agents[0].name))).handle_id
                        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
                        await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))

                step = runtimes // parts
                for done in range(step, runtimes + 1, step):
                    await asyncio.gather(*(one() for _ in range(step)))
                    points.append((done, rss_mb(process.pid)))
        finally:
            process.terminate()
            await process.wait()
    return points


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runtimes", type=int, default=10_000)
    parser.add_argument(
        "--flat", type=int, default=20_000, help="finished runtimes for the flatness figure (RSS from the 2,000th on)"
    )
    parser.add_argument("--only-flat", action="store_true", help="only the flatness figure")
    args = parser.parse_args()
    # Memory that stays flat (issue 43): a server that runs many small roots, each in a runtime
    # of its own, past its cache of 1,000, holds what the cache holds and nothing per root more:
    # roots of one handle, and roots that delegate to a child (a tree of two handles).
    for label, agents in (("one handle a root", (FINISHER,)), ("a root that delegates to a child", DELEGATING)):
        started = time.perf_counter()
        points = await memory(args.flat, agents, 1000, parts=args.flat // 2000)
        elapsed = time.perf_counter() - started
        series = ", ".join(f"{count:,}: {rss:.1f}" for count, rss in points)
        grown = points[-1][1] / points[0][1] - 1
        per_root = (points[-1][1] - points[0][1]) * 1024 * 1024 / (points[-1][0] - points[0][0])
        print(f"RSS (MB) by finished runtimes, {label}, default cache (1000): {series}  ({elapsed:.0f} s)")
        print(f"  from the {points[0][0]:,}th to the {points[-1][0]:,}th: {grown:+.1%} ({per_root:,.0f} bytes a root)")
    if args.only_flat:
        return
    cost = await journal_cost(turns=2000, batches=5)
    print(f"journal writes per tool-calling turn (WAL, synchronous=NORMAL, group commit): {cost:.0f} µs (median of 5 x 2000)")
    for label, agent, cache in (
        ("finished runtimes, default cache (1000)", FINISHER, 1000),
        ("suspended handles, default cache (1000)", WAITER, 1000),
        ("suspended handles, all kept in memory", WAITER, args.runtimes + 1),
    ):
        started = time.perf_counter()
        points = await memory(args.runtimes, (agent,), cache)
        elapsed = time.perf_counter() - started
        series = ", ".join(f"{count:,}: {rss:.0f} MB" for count, rss in points)
        print(f"RSS, {label}: {series}  ({elapsed:.0f} s)")


if __name__ == "__main__":
    asyncio.run(main())
