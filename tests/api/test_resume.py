"""Suspension and Resume over the wire: a pending Request as a client reads it (its typed calls,
idempotency keys and path), an Answer's outputs and refusals as codes, an approval's prompt,
the transcript a Resume replays, and a retried Resume after a restart of a server on SQLite.
The rules themselves (what a Resume continues, what runs again, what a bad Answer changes, a
child's suspension, expiries) are the fast tier's: tests/domain/test_suspension.py,
test_delegation.py, test_compaction.py, test_restore.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import Tree, replay
from google.protobuf import struct_pb2

from tests.support.build import agent, create, http_tool, run, spawn, status_details
from tests.support.calls import resume, until_state
from tests.support.model_server import Reply, ScriptedModelServer, last_tool_output, last_user, tool_results
from tests.support.scripts import delegates_to_worker, relay_answer, relay_tool, stage_approve_commit
from tests.support.servers import serve
from tests.support.tool_server import ToolServer


async def wait(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> pb.TaskResult:
    return (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result


async def start_scenario_c(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> tuple[str, str, pb.TaskResult]:
    """A worker with counter (http) and approve (relay), run until it suspends on approve."""
    model.script("worker", stage_approve_commit)
    worker = agent("worker", tools=[http_tool("counter", tools.url("counter")), relay_tool("approve")])
    runtime_id = await create(stub, worker)
    handle_id, pending = await run(stub, runtime_id, "worker", "stage then commit")
    return runtime_id, handle_id, pending


async def test_c_resume_replays_the_checkpoint(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    runtime_id, handle_id, pending = await start_scenario_c(stub, model, tools)

    assert pending.status == pb.STATUS_PENDING
    assert pending.pending.kind == "tool_call"
    assert [call.name for call in pending.pending.calls] == ["approve"]
    approve = pending.pending.calls[0]
    assert approve.idempotency_key == f"{runtime_id}/{handle_id}/{approve.id}"
    assert list(pending.pending.path) == ["root", "worker.1"]
    assert (tools.hits["counter"], pending.turns, pending.total_tokens) == (1, 2, 100)
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert (view.state, view.pending_kind) == (pb.HANDLE_STATE_SUSPENDED, "tool_call")

    with pytest.raises(grpc.aio.AioRpcError) as wrong:
        await resume(stub, runtime_id, pb.Answer(id="not-the-request", ok=True))
    assert wrong.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (await wait(stub, runtime_id, handle_id)) == pending  # nothing changed

    answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=approve.id, output="approved")])
    done = await resume(stub, runtime_id, answer)
    assert (done.status, done.text, done.limit) == (pb.STATUS_DONE, "committed", pb.LIMIT_UNSPECIFIED)
    assert (tools.hits["counter"], model.calls["worker"]) == (2, 4)
    assert (done.turns, done.total_tokens, done.own_tokens, done.tool_calls) == (4, 200, 200, 3)
    assert "approved" in [m["content"] for m in model.requests[2]["messages"] if m["role"] == "tool"]

    again = await resume(stub, runtime_id, answer)
    assert again == done
    assert (tools.hits["counter"], model.calls["worker"]) == (2, 4)
    assert await wait(stub, runtime_id, handle_id) == done

    with pytest.raises(grpc.aio.AioRpcError) as different:
        await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=False))
    assert different.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_structured_output_holding_nan_or_an_infinity_is_refused_and_changes_nothing(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    """A Value can hold NaN and infinities, JSON cannot: such an output is the caller's mistake
    (INVALID_ARGUMENT naming the output), never INTERNAL, and the Request waits on."""

    def script(body: dict[str, Any]) -> Reply:
        return Reply(calls=[("fetch", {})]) if tool_results(body) == 0 else Reply(text=last_tool_output(body))

    model.script("asker", script)
    runtime_id = await create(stub, agent("asker", tools=[relay_tool("fetch")]))
    handle_id, pending = await run(stub, runtime_id, "asker", "go")
    [call] = pending.pending.calls
    for bad in (float("nan"), float("inf"), float("-inf")):
        structured = struct_pb2.Value()
        structured.struct_value.fields["hits"].list_value.values.add().number_value = bad
        answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, structured=structured)])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await resume(stub, runtime_id, answer)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        [violation] = [v for d in status_details(refused.value) for v in getattr(d, "field_violations", [])]
        assert violation.field == "answer.outputs[0].structured" and "NaN or an infinity" in violation.description
        assert await wait(stub, runtime_id, handle_id) == pending
    finite = pb.ToolOutput(call_id=call.id, structured=struct_pb2.Value(number_value=1.5))
    good = pb.Answer(id=pending.pending.id, ok=True, outputs=[finite])
    done = await resume(stub, runtime_id, good)
    assert (done.status, done.text) == (pb.STATUS_DONE, "1.5")


async def test_c2_approval_runs_the_tool_once_after_yes(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def commit_then_report(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("commit", {})], tokens=50)
        return Reply(text="result: " + last_tool_output(body), tokens=50)

    model.script("committer", commit_then_report)
    commit = http_tool("commit", tools.url("commit"))
    commit.approval.CopyFrom(pb.ApprovalPolicy(required=True, prompt="Commit to production?"))
    runtime_id = await create(stub, agent("committer", tools=[commit]))

    _, pending = await run(stub, runtime_id, "committer", "ship it")
    assert (pending.status, pending.pending.kind) == (pb.STATUS_PENDING, "approval")
    assert pending.pending.prompt.startswith("Commit to production?")
    assert tools.hits["commit"] == 0
    done = await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True))
    assert (done.status, done.text) == (pb.STATUS_DONE, "result: commit ok #1")
    assert tools.hits["commit"] == 1 and model.calls["committer"] == 2

    _, pending = await run(stub, runtime_id, "committer", "ship it again")
    declined = await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=False, reason="change freeze"))
    assert declined.status == pb.STATUS_DONE
    assert declined.text == "result: declined by the host: change freeze"
    assert tools.hits["commit"] == 1


async def test_transcript_shows_what_will_be_replayed(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    runtime_id, handle_id, _ = await start_scenario_c(stub, model, tools)
    transcript = (await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))).messages
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert [c.name for c in transcript[-1].tool_calls] == ["approve"]
    assert (transcript[1].turn, transcript[3].turn) == (1, 2)


RELAY = pb.ToolDef(name="fetch", description="the host's fetch", relay=pb.RelayTool())


# ---- a retried Resume after a restart answers what the first answered -------------------


def fast_and_slow_worker(body: dict[str, Any]) -> Reply:
    if last_user(body) == "fast" and tool_results(body) == 0:
        return Reply(calls=[("fetch", {})], tokens=5)
    return Reply(text=f"worker {last_user(body)} done", tokens=5, delay=30 if last_user(body) == "slow" else 0)


async def _answered_under_a_running_parent(stub: pb_grpc.AgentRuntimeAsyncStub) -> tuple[str, str, pb.Answer, pb.TaskResult]:
    """The fast worker's Request answered while its coordinator still runs (the slow one is busy)."""
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[RELAY]))
    handle_id = await spawn(stub, runtime_id, "coordinator")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    fast = f"{handle_id}/worker.1"
    await until_state(stub, runtime_id, fast, pb.HANDLE_STATE_SUSPENDED)
    answer = relay_answer((await wait(stub, runtime_id, fast)).pending)
    first = await resume(stub, runtime_id, answer)
    assert (first.handle_id, first.status, first.text) == (fast, pb.STATUS_DONE, "worker fast done")
    return runtime_id, handle_id, answer, first


async def test_a_retried_resume_after_a_restart_returns_what_the_first_returned(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    model.script("coordinator", delegates_to_worker("fast", "slow"))
    model.script("worker", fast_and_slow_worker)
    settings: dict[str, Any] = {
        "llm_style": "openai",
        "llm_base_url": model.base_url,
        "llm_api_key": "sk-test",
        "store": f"sqlite:///{tmp_path / 'store.db'}",
    }
    async with serve(**settings) as served:
        runtime_id, handle_id, answer, first = await _answered_under_a_running_parent(served.stub)
        live = (await served.running.service.runtime(runtime_id)).tree.resumed_top
        stored = await served.running.store.load(runtime_id)
        assert stored is not None
        rebuilt = Tree(runtime_id, stored.agents)
        replay(rebuilt, stored.entries)
        assert rebuilt.resumed_top == live == {answer.id: first.handle_id}
    async with serve(**settings) as served:  # the coordinator goes on from its journal
        stub = served.stub
        again = await resume(stub, runtime_id, answer, timeout=5)
        assert (again.handle_id, again.status, again.text) == (first.handle_id, first.status, first.text)
        await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))
