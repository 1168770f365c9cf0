"""Suspension and Resume: the checkpoint is replayed, nothing already done runs or is bought again;
a suspending tool nobody answers lapses into an error result."""

from __future__ import annotations

import json

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, http_tool, run, spawn, struct, transcript, views
from tests.support.calls import Stub, handle_view, wake
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.poll import eventually
from tests.support.scripts import relay_tool, stage_approve_commit
from tests.support.sign_in import SignInTool, crm_script, signin
from tests.support.tool_server import ToolServer

__all__ = ["signin"]  # fixtures of tests/support, used here


def last_tool_output(body: dict) -> str:  # type: ignore[type-arg]
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")


async def wait(stub: pb_grpc.AgentRuntimeStub, runtime_id: str, handle_id: str) -> pb.TaskResult:
    return (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result


async def resume(stub: pb_grpc.AgentRuntimeStub, runtime_id: str, answer: pb.Answer) -> pb.TaskResult:
    return (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result


async def start_scenario_c(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> tuple[str, str, pb.TaskResult]:
    """A worker with counter (http) and approve (relay), run until it suspends on approve."""
    model.script("worker", stage_approve_commit)
    worker = agent("worker", tools=[http_tool("counter", tools.url("counter")), relay_tool("approve")])
    runtime_id = await create(stub, worker)
    handle_id, pending = await run(stub, runtime_id, "worker", "stage then commit")
    return runtime_id, handle_id, pending


async def test_c_resume_replays_the_checkpoint(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
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


async def test_relay_answer_naming_an_unknown_call_changes_nothing(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    def two_relays(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("fetch", {"n": 1}), ("fetch", {"n": 2})])
        return Reply(text=" + ".join(m["content"] for m in body["messages"] if m["role"] == "tool"))

    model.script("asker", two_relays)
    runtime_id = await create(stub, agent("asker", tools=[relay_tool("fetch")]))
    handle_id, pending = await run(stub, runtime_id, "asker", "go")
    first, second = pending.pending.calls
    assert [json.loads(c.arguments_json)["n"] for c in (first, second)] == [1, 2]
    bad = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id="call_9_9", output="?")])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await resume(stub, runtime_id, bad)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await wait(stub, runtime_id, handle_id) == pending
    # One output only: the other call gets an explicit error result.
    done = await resume(
        stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=second.id, output="two")])
    )
    assert done.status == pb.STATUS_DONE
    assert done.text == "the host returned no output for this call + two"


async def test_c2_approval_runs_the_tool_once_after_yes(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def commit_then_report(body: dict) -> Reply:  # type: ignore[type-arg]
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


async def test_guardrail_require_approval(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer) -> None:
    model.script(
        "op", lambda body: Reply(calls=[("drop", {})]) if tool_results(body) == 0 else Reply(text=last_tool_output(body))
    )
    rail = pb.Guardrail(tool="drop", action=pb.GUARDRAIL_ACTION_REQUIRE_APPROVAL, reason="dropping needs a human")
    runtime_id = await create(stub, agent("op", tools=[http_tool("drop", tools.url("drop"))], guardrails=[rail]))
    _, pending = await run(stub, runtime_id, "op", "go")
    assert pending.pending.kind == "approval" and "dropping needs a human" in pending.pending.prompt
    done = await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True))
    assert (done.text, tools.hits["drop"]) == ("drop ok #1", 1)


async def test_ask_tool_suspends_for_input(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    def curious(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("ask", {"question": "Which region?"})])
        return Reply(text="deploying to " + json.loads(last_tool_output(body))["region"])

    model.script("curious", curious)
    runtime_id = await create(stub, agent("curious"))
    _, pending = await run(stub, runtime_id, "curious", "deploy")
    assert (pending.pending.kind, pending.pending.prompt) == ("input", "Which region?")
    done = await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True, data=struct({"region": "eu-west"})))
    assert done.text == "deploying to eu-west"


def coordinator_of(workers: int, tokens: int) -> object:
    def script(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "worker", "prompt": str(i)}) for i in range(workers)], tokens=tokens)
        return Reply(text="all done", tokens=tokens)

    return script


def worker_suspends_on(*prompts: str) -> object:
    def script(body: dict) -> Reply:  # type: ignore[type-arg]
        if last_user(body) in prompts and tool_results(body) == 0:
            return Reply(calls=[("fetch", {})], tokens=10)
        return Reply(text=f"worker {last_user(body)} done", tokens=10)

    return script


async def test_d_nested_suspension_travels_to_the_root(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("coordinator", coordinator_of(1, 100))  # type: ignore[arg-type]
    model.script("worker", worker_suspends_on("0"))  # type: ignore[arg-type]
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[relay_tool("fetch")]))
    handle_id, pending = await run(stub, runtime_id, "coordinator", "go")

    assert pending.status == pb.STATUS_PENDING
    assert list(pending.pending.path) == ["root", "coordinator.1", "worker.1"]
    assert (pending.total_tokens, pending.own_tokens) == (110, 100)
    listed = await views(stub, runtime_id)
    assert [listed[h].state for h in (handle_id, f"{handle_id}/worker.1")] == [pb.HANDLE_STATE_SUSPENDED] * 2
    assert listed[handle_id].pending_kind == "tool_call"

    call = pending.pending.calls[0]
    done = await resume(
        stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="data")])
    )
    assert (done.handle_id, done.status, done.text) == (handle_id, pb.STATUS_DONE, "all done")
    assert (done.total_tokens, done.own_tokens, done.turns) == (220, 200, 2)
    assert (model.calls["coordinator"], model.calls["worker"]) == (2, 2)


async def test_e_fan_out_replays_only_the_suspended_worker(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("coordinator", coordinator_of(4, 100))  # type: ignore[arg-type]
    model.script("worker", worker_suspends_on("1"))  # type: ignore[arg-type]
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[relay_tool("fetch")]))
    handle_id, pending = await run(stub, runtime_id, "coordinator", "go")
    assert list(pending.pending.path) == ["root", "coordinator.1", "worker.2"]

    call = pending.pending.calls[0]
    done = await resume(
        stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="x")])
    )
    assert done.status == pb.STATUS_DONE
    listed = await views(stub, runtime_id)
    assert [listed[f"{handle_id}/worker.{n}"].turns for n in (1, 2, 3, 4)] == [1, 2, 1, 1]
    assert (model.calls["coordinator"], model.calls["worker"]) == (2, 5)
    assert done.total_tokens == 200 + 5 * 10


async def test_two_suspensions_in_one_turn_are_answered_in_any_order(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    model.script("coordinator", coordinator_of(3, 100))  # type: ignore[arg-type]
    model.script("worker", worker_suspends_on("0", "2"))  # type: ignore[arg-type]
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[relay_tool("fetch")]))
    handle_id, pending = await run(stub, runtime_id, "coordinator", "go")
    assert list(pending.pending.path) == ["root", "coordinator.1", "worker.1"]
    third = (await wait(stub, runtime_id, f"{handle_id}/worker.3")).pending

    def answer(request: pb.Request) -> pb.Answer:
        return pb.Answer(id=request.id, ok=True, outputs=[pb.ToolOutput(call_id=request.calls[0].id, output="ok")])

    still = await resume(stub, runtime_id, answer(third))
    assert (still.handle_id, still.status) == (handle_id, pb.STATUS_PENDING)
    assert still.pending.id == pending.pending.id
    done = await resume(stub, runtime_id, answer(pending.pending))
    assert (done.status, done.text) == (pb.STATUS_DONE, "all done")
    assert (model.calls["coordinator"], model.calls["worker"]) == (2, 5)


async def test_interrupting_a_suspended_worker_lets_the_coordinator_go_on(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    model.script("coordinator", coordinator_of(1, 100))  # type: ignore[arg-type]
    model.script("worker", worker_suspends_on("0"))  # type: ignore[arg-type]
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[relay_tool("fetch")]))
    handle_id, pending = await run(stub, runtime_id, "coordinator", "go")
    worker_id = f"{handle_id}/worker.1"
    assert (await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=worker_id))).interrupted
    assert (await wait(stub, runtime_id, worker_id)).status == pb.STATUS_INTERRUPTED
    done = await wait(stub, runtime_id, handle_id)
    assert (done.status, done.text) == (pb.STATUS_DONE, "all done")
    told = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert "INTERRUPTED" in told[0]
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True))
    assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_close_a_suspended_root_cancels_its_request(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("coordinator", coordinator_of(1, 100))  # type: ignore[arg-type]
    model.script("worker", worker_suspends_on("0"))  # type: ignore[arg-type]
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[relay_tool("fetch")]))
    handle_id, pending = await run(stub, runtime_id, "coordinator", "go")
    closed = await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert list(closed.closed_handle_ids) == [f"{handle_id}/worker.1", handle_id]
    assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_CLOSED
    assert (await wait(stub, runtime_id, f"{handle_id}/worker.1")).status == pb.STATUS_CLOSED
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True))
    assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert model.calls["coordinator"] == 1


async def test_transcript_shows_what_will_be_replayed(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    runtime_id, handle_id, _ = await start_scenario_c(stub, model, tools)
    transcript = (await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))).messages
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert [c.name for c in transcript[-1].tool_calls] == ["approve"]
    assert (transcript[1].turn, transcript[3].turn) == (1, 2)


async def test_a_call_that_asks_twice_has_one_request_per_question(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    """A relay tool behind an approval asks for the approval, then for its output."""
    model.script(
        "ops", lambda body: Reply(calls=[("deploy", {})]) if tool_results(body) == 0 else Reply(text=last_tool_output(body))
    )
    deploy = relay_tool("deploy")
    deploy.approval.CopyFrom(pb.ApprovalPolicy(required=True))
    runtime_id = await create(stub, agent("ops", tools=[deploy]))
    _, approval = await run(stub, runtime_id, "ops", "ship")
    assert approval.pending.kind == "approval"
    yes = pb.Answer(id=approval.pending.id, ok=True)
    relay = await resume(stub, runtime_id, yes)
    assert relay.pending.kind == "tool_call"
    assert relay.pending.id != approval.pending.id
    assert await resume(stub, runtime_id, yes) == relay  # the retried approval answers nothing else
    call = relay.pending.calls[0]
    done = await resume(
        stub, runtime_id, pb.Answer(id=relay.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="shipped")])
    )
    assert (done.status, done.text, done.tool_calls) == (pb.STATUS_DONE, "shipped", 1)


# ---- a suspending tool nobody answers ---------------------------------------------------------------


async def test_an_unanswered_suspending_tool_lapses_into_an_error_result(
    stub: Stub, model: ScriptedModelServer, signin: SignInTool
) -> None:
    signin.expires_in = 1.0
    model.script("crm", crm_script)
    runtime_id = await create(stub, agent("crm", tools=[http_tool("crm_login", signin.url())]))
    handle_id = await spawn(stub, runtime_id, "crm")
    await wake(stub, runtime_id, handle_id, "log in to the CRM")
    pending = await wait(stub, runtime_id, handle_id)
    assert (pending.status, pending.pending.kind) == (pb.STATUS_PENDING, "authorization")

    async def lapsed() -> bool:
        return (await handle_view(stub, runtime_id, handle_id)).state != pb.HANDLE_STATE_SUSPENDED

    await eventually(lapsed, "the request to lapse", timeout=5)
    done = await wait(stub, runtime_id, handle_id)
    assert done.status == pb.STATUS_DONE
    assert done.text.startswith("crm: ") and "expired" in done.text
    [tool] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool.is_error and "expired" in tool.content
    assert len(signin.calls) == 1  # nobody answered: the tool is not called again
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await resume(stub, runtime_id, pb.Answer(id=pending.pending.id, ok=True, data=struct({"code": "late"})))
    assert late.value.code() == grpc.StatusCode.FAILED_PRECONDITION
