"""Timers across a crash: heartbeats (the periods missed while the server was down come due at
the restart as one tick), a compaction cut by a crash, and Requests that expire (they lapse
after a crash and a restart too, and while nothing else keeps their runtime in memory). Real
server processes, SIGKILL, then a restart. The timers' rules on a clock moved by hand (a first
tick missed, a closed handle's heartbeat, a long run's ticks) are the fast tier's:
tests/domain/test_heartbeats_and_expiries.py."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, duration, http_tool, spawn, transcript, views, wait
from tests.support.calls import events_until
from tests.support.model_server import Reply, ScriptedModelServer, last_user
from tests.support.poll import until
from tests.support.process import ServerProcess
from tests.support.scripts import STEPS, stepper
from tests.support.sign_in import SignInTool, crm_script, signin
from tests.support.tool_server import ToolServer

__all__ = ["signin"]  # fixtures of tests/support, used here

CATCH_UP = re.compile(r"\[from heartbeat, (\d+) times: the latest shown\] tick$")


async def test_heartbeats_wake_an_idle_handle_and_count_the_downtime_as_one_tick(
    process: ServerProcess, model: ScriptedModelServer
) -> None:
    runs: list[tuple[float, str]] = []  # (when, the run's last user message), per model call

    def beater(body: dict[str, Any]) -> Reply:
        runs.append((time.monotonic(), last_user(body)))
        return Reply(text="beat", tokens=1)

    model.script("beater", beater)
    stub = await process.start()
    runtime_id = await create(stub, agent("beater", heartbeat=pb.Heartbeat(every=duration(1), prompt="tick")))
    spawned = time.monotonic()
    handle_id = await spawn(stub, runtime_id, "beater")

    # Never woken by the host: the ticks wake it, once a period.
    await until(lambda: len(runs) >= 2, "two heartbeat runs", timeout=2.8)
    assert runs[1][0] - spawned <= 2.8
    assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_DONE
    users = [m.content for m in await transcript(stub, runtime_id, handle_id) if m.role == "user"]
    assert len(users) >= 2
    assert all(content == "Messages received:\n[from heartbeat] tick" for content in users), users

    await process.stop(signal.SIGKILL)
    before = len(runs)
    await asyncio.sleep(3.5)
    restarted = time.monotonic()
    stub = await process.restart()

    # The periods missed while the server was down come due as ONE tick that counts them.
    await until(lambda: len(runs) > before, "the catch-up run after the restart", timeout=5)
    catch_up = CATCH_UP.search(runs[before][1])
    assert catch_up is not None, runs[before][1]
    assert 2 <= int(catch_up.group(1)) <= 10, runs[before][1]
    # No burst: the next run is the next period's own tick, a period later.
    await until(lambda: len(runs) > before + 1, "the next period's run", timeout=5)
    assert runs[before + 1][0] - runs[before][0] >= 0.5, [when - restarted for when, _ in runs[before:]]
    assert runs[before + 1][1] == "Messages received:\n[from heartbeat] tick"
    messages = await transcript(stub, runtime_id, handle_id)
    assert [m.content for m in messages if m.role == "user" and "times: the latest shown" in m.content] == [runs[before][1]]


async def test_a_crash_mid_compaction_summarizes_once_and_bills_the_summarizer_once(
    process: ServerProcess, model: ScriptedModelServer, tools: ToolServer
) -> None:
    """Killed while the summarizer's model call is out: after the restart the same summarizer
    goes on (no second one for that turn), its summary takes effect once, and the handle's
    total_tokens is its own plus what its summarizers spent, each once."""
    summarizer_calls: list[float] = []

    def summarize(body: dict[str, Any]) -> Reply:
        summarizer_calls.append(time.monotonic())
        delay = 60.0 if len(summarizer_calls) == 1 else 0.0  # the first is cut by the crash
        return Reply(text="Steps so far all succeeded.", tokens=7, delay=delay)

    model.script("worker", stepper)
    model.script("summarizer", summarize)
    stub = await process.start()
    compaction = pb.Compaction(max_context_tokens=150, keep_last_turns=2, summarizer_agent="summarizer")
    worker = agent("worker", tools=[http_tool("step", tools.url("step"))], compaction=compaction)
    runtime_id = await create(stub, worker, agent("summarizer"))
    handle_id = await spawn(stub, runtime_id, "worker")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="run the steps"))
    await until(lambda: len(summarizer_calls) >= 1, "the first summarizer call", timeout=10)
    # A model call waits for no commit, so the summarizer's can be out before the last step's
    # result is durable (a kill then leaves that call in doubt, and RETRY runs it again). A
    # watched event is durable, with every step before it: the kill lands after its commit.
    await events_until(stub, runtime_id, lambda event: event.spawned.agent == "summarizer")
    await process.stop(signal.SIGKILL)

    stub = await process.restart()
    result = await wait(stub, runtime_id, handle_id)
    assert (result.status, result.text, result.tool_calls) == (pb.STATUS_DONE, "all steps done", STEPS)
    assert tools.hits["step"] == STEPS
    messages = await transcript(stub, runtime_id, handle_id)
    summaries = [m for m in messages if m.summary]
    summarizers = [view for view in (await views(stub, runtime_id)).values() if view.agent == "summarizer"]
    assert summaries and len(summarizers) == len(summaries) == len(summarizer_calls) - 1
    assert all(view.parent_id == handle_id and view.last_status == pb.STATUS_DONE for view in summarizers)
    assert [view.turns for view in summarizers] == [1] * len(summarizers)
    assert result.own_tokens == result.turns * 10
    assert result.total_tokens == result.own_tokens + 7 * len(summarizers)


# ---- a Request that expires -------------------------------------------------------------------------


async def _pending_sign_in(stub: pb_grpc.AgentRuntimeAsyncStub, tool: SignInTool) -> tuple[str, str]:
    runtime_id = await create(stub, agent("crm", tools=[http_tool("crm_login", tool.url())]))
    handle_id = await spawn(stub, runtime_id, "crm")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="log in"))
    assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_PENDING
    return runtime_id, handle_id


async def _lapses(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, model: ScriptedModelServer, within: float) -> None:
    """The Request lapses on its own: the model is called again without any RPC on the runtime."""
    await until(lambda: model.calls["crm"] >= 2, "the expired Request to lapse", timeout=within)
    rows = (await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes
    assert next(row for row in rows if row.runtime_id == runtime_id).suspended_count == 0


async def test_an_expiring_request_lapses_after_a_crash_and_a_restart(
    process: ServerProcess, model: ScriptedModelServer, signin: SignInTool
) -> None:
    signin.expires_in = 3.0
    model.script("crm", crm_script)
    stub = await process.start()
    runtime_id, _ = await _pending_sign_in(stub, signin)
    await process.stop(signal.SIGKILL)
    stub = await process.restart()
    await _lapses(stub, runtime_id, model, within=10)


async def test_an_expiring_request_keeps_its_runtime_in_memory_until_it_lapses(
    tmp_path: Path, model: ScriptedModelServer, signin: SignInTool
) -> None:
    signin.expires_in = 3.0
    model.script("crm", crm_script)
    process = ServerProcess(tmp_path / "s.db", model.base_url, tmp_path / "server.log", env={"AGENTRUNTIME_RUNTIME_CACHE": "1"})
    stub = await process.start()
    try:
        runtime_id, _ = await _pending_sign_in(stub, signin)
        await create(stub, agent("other"))  # the cache holds one idle runtime: an idle one would leave memory
        await _lapses(stub, runtime_id, model, within=10)
    finally:
        await process.stop()
