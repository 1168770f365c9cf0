"""Acknowledged means persisted: a real server process on a SQLite file, killed and restarted. A
run pending on a Request resumes after it, one in a turn recovers, a call in doubt asks, and
a suspending tool's Request is answered after it."""

from __future__ import annotations

import contextlib
import datetime
import json
import signal
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import Tree, replay
from agentruntime_server.store.sqlite import SqliteStore
from google.protobuf import json_format

from tests.support.build import agent, create, http_tool, run, spawn, struct, views
from tests.support.calls import handle_view, resume, wake
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.poll import until
from tests.support.process import ServerProcess
from tests.support.scripts import relay_tool, stage_approve_commit
from tests.support.sign_in import SignInTool, crm_script, signin
from tests.support.tool_server import ToolServer

__all__ = ["signin"]  # fixtures of tests/support, used here


async def wait(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> pb.TaskResult:
    return (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=60)).result


async def test_restart_while_pending_then_resume(process: ServerProcess, model: ScriptedModelServer, tools: ToolServer) -> None:
    """Scenario C across a SIGKILL: the suspended worker resumes exactly as before."""
    model.script("worker", stage_approve_commit)
    stub = await process.start()
    worker = agent("worker", tools=[http_tool("counter", tools.url("counter")), relay_tool("approve")])
    runtime_id = await create(stub, worker)
    handle_id, pending = await run(stub, runtime_id, "worker", "stage then commit")
    assert (pending.status, tools.hits["counter"], pending.turns, pending.total_tokens) == (pb.STATUS_PENDING, 1, 2, 100)

    await process.stop(signal.SIGKILL)
    stub = await process.restart()

    assert await wait(stub, runtime_id, handle_id) == pending
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert (view.state, view.pending_kind) == (pb.HANDLE_STATE_SUSPENDED, "tool_call")
    approve = pending.pending.calls[0]
    answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=approve.id, output="approved")])
    done = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
    assert (done.status, done.text) == (pb.STATUS_DONE, "committed")
    assert (tools.hits["counter"], model.calls["worker"], done.turns, done.total_tokens) == (2, 4, 4, 200)

    # The answer itself is durable: after another restart, the same Resume returns the same result.
    await process.stop(signal.SIGKILL)
    stub = await process.restart()
    again = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
    assert (again.status, again.text, again.total_tokens) == (pb.STATUS_DONE, "committed", 200)
    assert (tools.hits["counter"], model.calls["worker"]) == (2, 4)
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert [m.role for m in transcript.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


async def _journal(store: Path) -> tuple[Counter[str], set[str]]:
    """From the store file after a kill (read through the store, as a restart would): replies
    journaled per handle key, and the idempotency keys of calls started but never recorded
    (in doubt)."""
    sqlite = SqliteStore(str(store))
    journaled: Counter[str] = Counter()
    in_doubt: set[str] = set()
    try:
        with contextlib.closing(sqlite3.connect(store)) as db:
            runtime_ids = [runtime_id for (runtime_id,) in db.execute("SELECT id FROM runtimes")]
        for runtime_id in runtime_ids:
            stored = await sqlite.load(runtime_id)
            assert stored is not None
            tree = Tree(runtime_id, stored.agents)
            replay(tree, stored.entries)
            for handle in tree.handles.values():
                journaled[f"{handle.agent.name}|{handle.transcript[0].content}"] = sum(
                    1 for message in handle.transcript if message.role == "assistant"
                )
                in_doubt.update(f"{runtime_id}/{handle.id}/{call_id}" for call_id in handle.started)
    finally:
        await sqlite.close()
    return journaled, in_doubt


def _key(body: dict[str, Any]) -> str:
    """Which handle a model call belongs to: the agent (model) and its first prompt."""
    first_prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return f"{body['model']}|{first_prompt}"


async def test_crash_mid_turn_recovers_every_runtime(
    process: ServerProcess, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def coordinator(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            job = last_user(body)
            calls = [("task", {"agent": "worker", "prompt": f"{job} part {part}"}) for part in (1, 2)]
            return Reply(calls=calls, tokens=100, delay=0.2)
        return Reply(text="merged", tokens=100, delay=0.2)

    def worker(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("hit", {"job": last_user(body)})], tokens=10, delay=0.2)
        return Reply(text="worked", tokens=10, delay=0.2)

    model.script("coordinator", coordinator)
    model.script("worker", worker)
    tools.delays["hit"] = 0.2
    clean_calls = {"coordinator": 2, "worker": 2}
    stub = await process.start()
    hit = http_tool("hit", tools.url("hit"))
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[hit]))
    roots = []
    for job in range(50):
        handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="coordinator"))).handle_id
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=f"job {job}"))
        roots.append(handle_id)
    await until(lambda: sum(tools.hits.values()) >= 40, "the runs to be well under way")

    process.send(signal.SIGKILL)
    await process.stop()
    assert isinstance(process.store, Path)  # a SQLite file (the `process` fixture's)
    journaled, in_doubt = await _journal(process.store)
    calls_before = Counter(_key(body) for body in model.requests)
    assert sum(calls_before[key] - journaled[key] for key in calls_before) > 0, "the kill should land mid-call"

    stub = await process.restart()
    for handle_id in roots:
        result = await wait(stub, runtime_id, handle_id)
        assert (result.status, result.text) == (pb.STATUS_DONE, "merged"), handle_id
        assert (result.own_tokens, result.total_tokens, result.turns) == (200, 240, 2), handle_id
    calls = Counter(_key(body) for body in model.requests)
    for key, count in calls.items():
        # After the restart a handle buys exactly the replies its journal lacks: none twice.
        assert count - calls_before[key] == clean_calls[key.split("|")[0]] - journaled[key], key
    hits_per_key = Counter(tools.keys)
    assert len(hits_per_key) == 100  # every worker's one call ran
    for key, hits in hits_per_key.items():
        assert hits == 1 or (hits == 2 and key in in_doubt), (key, hits)
    listed = await views(stub, runtime_id)
    assert all(view.state == pb.HANDLE_STATE_IDLE for view in listed.values())


async def test_in_doubt_call_with_ask_policy_suspends_after_a_crash(
    process: ServerProcess, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def payer(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("charge", {"cents": 500})], tokens=10)
        last_tool = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
        return Reply(text=f"charge: {last_tool}", tokens=10)

    model.script("payer", payer)
    tools.delays["charge"] = 30
    charge = http_tool("charge", tools.url("charge"))
    charge.on_interrupted = pb.ON_INTERRUPTED_ASK
    stub = await process.start()
    runtime_id = await create(stub, agent("payer", tools=[charge]))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="payer"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
    await until(lambda: bool(tools.in_flight_keys), "the charge call to be in flight")
    await process.stop(signal.SIGKILL)
    tools.delays["charge"] = 0

    stub = await process.restart()
    pending = await wait(stub, runtime_id, handle_id)
    assert (pending.status, pending.pending.kind) == (pb.STATUS_PENDING, "in_doubt")
    [call] = pending.pending.calls
    assert (call.name, json.loads(call.arguments_json)) == ("charge", {"cents": 500})
    assert call.idempotency_key == tools.keys[0]
    answer = pb.Answer(id=pending.pending.id, ok=True)  # no output: run it again, same key
    done = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
    assert (done.status, done.text) == (pb.STATUS_DONE, "charge: charge ok #2")
    assert tools.keys == [call.idempotency_key, call.idempotency_key]
    assert model.calls["payer"] == 2  # the reply that made the call was not bought again


# ---- suspending tools -----------------------------------------------------------------------


async def test_a_suspending_tool_is_answered_after_a_restart(
    process: ServerProcess, model: ScriptedModelServer, signin: SignInTool
) -> None:
    model.script("crm", crm_script)
    stub = await process.start()
    runtime_id = await create(stub, agent("crm", tools=[http_tool("crm_login", signin.url())]))
    handle_id = await spawn(stub, runtime_id, "crm")
    await wake(stub, runtime_id, handle_id, "log in to the CRM")
    pending = await wait(stub, runtime_id, handle_id)
    request = pending.pending
    assert (pending.status, request.kind, request.prompt, request.url) == (
        pb.STATUS_PENDING,
        "authorization",
        "sign in",
        "https://example.invalid/login",
    )
    expected = datetime.datetime.fromisoformat(signin.expires_at).timestamp()
    assert request.HasField("expires_at") and abs(request.expires_at.ToNanoseconds() / 1e9 - expected) < 0.01
    assert json_format.MessageToDict(request.data) == {"session": "s1"}
    assert (await handle_view(stub, runtime_id, handle_id)).pending_kind == "authorization"

    await process.stop(signal.SIGKILL)
    stub = await process.restart()

    answer = pb.Answer(id=request.id, ok=True, data=struct({"code": "xyz"}))
    done = await resume(stub, runtime_id, answer)
    assert (done.status, done.text) == (pb.STATUS_DONE, "crm: signed in as ada")
    assert len(signin.calls) == 2
    (first_key, first_answer), (second_key, second_answer) = signin.calls
    assert first_answer is None and first_key == second_key == f"{runtime_id}/{handle_id}/call_1_1"
    assert second_answer is not None
    sent = json.loads(second_answer)
    assert (sent["ok"], sent["data"], sent["id"]) == (True, {"code": "xyz"}, request.id)
    assert model.calls["crm"] == 2


async def test_sigterm_drains_and_the_run_goes_on_after_restart(process: ServerProcess, model: ScriptedModelServer) -> None:
    model.script("steady", lambda body: Reply(text="finished", tokens=10, delay=1.0))
    stub = await process.start()
    runtime_id = await create(stub, agent("steady"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="steady"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    await until(lambda: bool(model.in_flight_bodies), "the model call to be in flight")
    assert await process.stop(signal.SIGTERM) == 0
    assert model.calls["steady"] == 1
    stub = await process.restart()
    result = await wait(stub, runtime_id, handle_id)
    assert (result.status, result.text, result.turns, result.own_tokens) == (pb.STATUS_DONE, "finished", 1, 10)
    assert model.calls["steady"] == 1  # the reply was journaled before the process exited
