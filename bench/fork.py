"""ForkRuntime's cost as its source's journal grows: a runtime of about 1,000 and of about
10,000 journal steps (a lead delegating to workers through `task`, the embedded scripted model,
a SQLite file), forked at its last event and at its middle event, several times each. Figures:
the median time of a ForkRuntime call as the client sees it, and the bytes the fork adds to the
store (its row's `bytes`: its definitions and its copied steps, what the tenant's store quota
counts) against the source's. The collector is tuned as a serving process tunes it. Measured,
never asserted (docs/performance.md#fork)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentruntime_server.process.collector import tune_for_serving
from agentruntime_server.process.event_loop import DEFAULT_LOOP, loop_factory

from tests.support.servers import serve

RUNS = 7
SIZES = (140, 1_400)  # workers: about 7 journal steps each


def _definitions(workers: int) -> list[pb.AgentDef]:
    calls = [
        pb.ScriptedToolCall(name="task", arguments_json=json.dumps({"agent": "worker", "prompt": f"part {n}"}))
        for n in range(workers)
    ]
    lead = pb.AgentDef(
        name="lead",
        description="splits the work",
        team=["worker"],
        budget=pb.Budget(max_children=workers, max_tool_calls=workers + 1),
        script=pb.Script(replies=[pb.ScriptedReply(tool_calls=calls, tokens=20), pb.ScriptedReply(text="done", tokens=10)]),
    )
    worker = pb.AgentDef(
        name="worker", description="does a part", script=pb.Script(replies=[pb.ScriptedReply(text="ok", tokens=5)])
    )
    return [lead, worker]


def _row(path: Path, runtime_id: str) -> tuple[int, int, int]:
    """(its journal steps, its last event, its bytes) as the store holds them."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        steps, last = db.execute(
            "SELECT max(coalesce(last_seq, seq)), max(last_event) FROM journal WHERE runtime_id = ?", (runtime_id,)
        ).fetchone()
        (size,) = db.execute("SELECT bytes FROM runtimes WHERE id = ?", (runtime_id,)).fetchone()
    return steps, last, size


async def measure(workers: int, folder: Path) -> None:
    path = folder / f"fork-{workers}.db"
    async with serve(store=f"sqlite:///{path}", max_handles=workers + 10) as served:
        stub = served.stub
        runtime_id = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=_definitions(workers)))).runtime_id
        lead = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="lead"))).handle_id
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=lead, prompt="go"))
        result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=lead), timeout=600)).result
        assert result.status == pb.STATUS_DONE, result
        await served.running.service.acknowledge()
        steps, last, source_bytes = _row(path, runtime_id)
        for label, at in (("last event", last), ("middle event", last // 2)):
            times, added = [], []
            for _ in range(RUNS):
                started = time.perf_counter()
                forked = await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=runtime_id, at_seq=at), timeout=600)
                times.append(time.perf_counter() - started)
                await served.running.service.acknowledge()
                added.append(_row(path, forked.runtime_id)[2])
                await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=forked.runtime_id))
            print(
                f"  {steps:>6} steps, fork at the {label:<12} (seq {at:>6}): median {statistics.median(times) * 1000:7.1f} ms"
                f" (range {min(times) * 1000:.1f}-{max(times) * 1000:.1f}), {statistics.median(added) / 1024:8.1f} KiB added"
                f" (the source: {source_bytes / 1024:.1f} KiB)"
            )


async def main() -> None:
    tune_for_serving()  # the collector as a serving process has it (process/collector.py)
    print(f"ForkRuntime on SQLite, {RUNS} forks each, the embedded scripted model, the serving GC thresholds")
    with tempfile.TemporaryDirectory() as folder:
        for workers in SIZES:
            await measure(workers, Path(folder))


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=loop_factory(DEFAULT_LOOP)) as runner:
        runner.run(main())
