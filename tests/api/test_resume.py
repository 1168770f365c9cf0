"""Suspension and Resume: the checkpoint is replayed, nothing already done runs or is bought again;
a suspending tool nobody answers lapses into an error result. A judge or a summarizer that
asks suspends the handle it serves; a retried Resume (after a restart too) returns what the
first returned; the completion gate counts its rejections over a Resume; a compaction after
a rolled-back run is written again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import Tree, replay
from google.protobuf import struct_pb2

from tests.support.build import agent, create, http_tool, run, spawn, status_details, struct, transcript, views
from tests.support.calls import Stub, handle_view, resume, state_of, until_state, wake
from tests.support.model_server import Reply, ScriptedModelServer, last_tool_output, last_user, tool_results
from tests.support.poll import eventually, until
from tests.support.scripts import delegates_to_worker, relay_answer, relay_tool, stage_approve_commit
from tests.support.servers import serve
from tests.support.sign_in import SignInTool, crm_script, signin
from tests.support.tool_server import ToolServer

__all__ = ["signin"]  # fixtures of tests/support, used here


async def wait(stub: pb_grpc.AgentRuntimeStub, runtime_id: str, handle_id: str) -> pb.TaskResult:
    return (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result


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


async def test_a_structured_output_holding_nan_or_an_infinity_is_refused_and_changes_nothing(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
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


RELAY = pb.ToolDef(name="fetch", description="the host's fetch", relay=pb.RelayTool())
BIG = "x" * 2400


# ---- a judge or a summarizer that suspends suspends its handle -------------------------


async def test_a_judge_that_asks_suspends_the_handle_it_judges(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("writer", lambda body: Reply(text="draft", tokens=10))
    model.script(
        "judge",
        lambda body: (
            Reply(calls=[("ask", {"question": "Is a draft enough?"})], tokens=5)
            if tool_results(body) == 0
            else Reply(text="PASS" if "yes" in body["messages"][-1]["content"] else "FAIL", tokens=5)
        ),
    )
    writer = agent("writer", completion=pb.CompletionGate(judge_agent="judge", max_attempts=1))
    runtime_id = await create(stub, writer, agent("judge"))
    handle_id, result = await run(stub, runtime_id, "writer", "write")
    judge = f"{handle_id}/judge.1"
    assert result.status == pb.STATUS_PENDING
    assert (result.pending.kind, result.pending.prompt, "/".join(result.pending.path)) == ("input", "Is a draft enough?", judge)
    assert (await state_of(stub, runtime_id, handle_id)) == pb.HANDLE_STATE_SUSPENDED

    done = await resume(stub, runtime_id, pb.Answer(id=result.pending.id, ok=True, reason="yes"))
    assert (done.handle_id, done.status, done.text) == (handle_id, pb.STATUS_DONE, "draft")
    assert (model.calls["writer"], model.calls["judge"], done.turns, done.total_tokens) == (1, 2, 1, 20)
    assert (await wait(stub, runtime_id, judge)).status == pb.STATUS_DONE


async def test_a_summarizer_that_asks_suspends_the_handle_it_compacts(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    def worker(body: dict[str, Any]) -> Reply:
        # A big call, a small one (the request is too big now, but its one turn is kept), then
        # the request that is compacted: the summarizer asks the host first.
        # (By the summary, not the tool results: compaction shortens what the model is sent.)
        if any("SUMMARY" in (m["content"] or "") for m in body["messages"]):
            return Reply(text="done", tokens=10)
        return Reply(calls=[("noop", {"blob": BIG} if tool_results(body) == 0 else {})], tokens=10)

    model.script("w", worker)
    model.script(
        "sum",
        lambda body: (
            Reply(calls=[("ask", {"question": "Keep the blob?"})], tokens=3)
            if tool_results(body) == 0
            else Reply(text="SUMMARY: a blob was sent", tokens=3)
        ),
    )
    compaction = pb.Compaction(max_context_tokens=500, keep_last_turns=1, summarizer_agent="sum")
    runtime_id = await create(stub, agent("w", compaction=compaction), agent("sum"))
    # (A turn cap: a handle that went on without its summary would never be shown one.)
    handle_id, result = await run(stub, runtime_id, "w", "zero", budget=pb.Budget(max_turns=5))
    assert result.status == pb.STATUS_PENDING
    assert ("/".join(result.pending.path), result.pending.prompt) == (f"{handle_id}/sum.1", "Keep the blob?")
    assert model.calls["w"] == 2  # no third call without the summary it waits for

    done = await resume(stub, runtime_id, pb.Answer(id=result.pending.id, ok=True, reason="no"))
    assert (done.handle_id, done.status, done.text) == (handle_id, pb.STATUS_DONE, "done")
    sent = model.requests[-1]["messages"]
    assert any(m["role"] == "user" and "SUMMARY: a blob was sent" in m["content"] for m in sent)
    assert (model.calls["w"], model.calls["sum"]) == (3, 2)


# ---- a retried Resume answers what the first answered -----------------------------------


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


async def test_a_retried_resume_returns_what_the_first_returned(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("coordinator", delegates_to_worker("fast", "slow"))
    model.script("worker", fast_and_slow_worker)
    runtime_id, handle_id, answer, first = await _answered_under_a_running_parent(stub)

    again = await resume(stub, runtime_id, answer, timeout=5)  # not the coordinator's result, after its slow child
    assert (again.handle_id, again.status, again.text, again.total_tokens) == (
        first.handle_id,
        first.status,
        first.text,
        first.total_tokens,
    )
    await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))


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
        runtime_id, handle_id, answer, first = await _answered_under_a_running_parent(
            cast("pb_grpc.AgentRuntimeAsyncStub", served.stub)
        )
        live = (await served.running.service.runtime(runtime_id)).tree.resumed_top
        stored = await served.running.store.load(runtime_id)
        assert stored is not None
        rebuilt = Tree(runtime_id, stored.agents)
        replay(rebuilt, stored.entries)
        assert rebuilt.resumed_top == live == {answer.id: first.handle_id}
    async with serve(**settings) as served:  # the coordinator goes on from its journal
        stub = cast("pb_grpc.AgentRuntimeAsyncStub", served.stub)
        again = await resume(stub, runtime_id, answer, timeout=5)
        assert (again.handle_id, again.status, again.text) == (first.handle_id, first.status, first.text)
        await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))


# ---- the completion gate counts its rejections over a Resume ----------------------------


async def test_the_completion_gate_counts_rejections_over_a_resume(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    def sloppy(body: dict[str, Any]) -> Reply:
        # A rejected answer, then a relay call, then rejected answers for ever.
        if sum(m["role"] == "assistant" for m in body["messages"]) == 1:
            return Reply(calls=[("fetch", {})], tokens=10)
        return Reply(text="nope", tokens=10)

    model.script("sloppy", sloppy)
    gate = pb.CompletionGate(must_match="^VERIFIED", max_attempts=2)
    runtime_id = await create(stub, agent("sloppy", completion=gate, tools=[RELAY]))
    _, first = await run(stub, runtime_id, "sloppy", "verify it")
    assert (first.status, first.turns) == (pb.STATUS_PENDING, 2)  # rejected once, then the relay call

    done = await resume(stub, runtime_id, relay_answer(first.pending))
    # The second rejection (turn 3) is the last one max_attempts allows: no fourth turn is bought.
    assert (done.status, done.limit, done.turns, model.calls["sloppy"]) == (pb.STATUS_INCOMPLETE, pb.LIMIT_COMPLETION, 3, 3)


# ---- a compaction after a rolled-back run gets a summarizer of its own ------------------


async def test_a_compaction_after_a_rolled_back_run_is_written_again(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    phase = {"run": 0, "one": 0}

    def worker(body: dict[str, Any]) -> Reply:
        if phase["run"] == 0:
            return Reply(calls=[("noop", {})], tokens=10) if tool_results(body) == 0 else Reply(text="r0", tokens=10)
        if phase["run"] == 1:
            phase["one"] += 1
            if phase["one"] == 1:
                return Reply(calls=[("noop", {"blob": BIG})], tokens=10)
            return Reply(text="late", tokens=10, delay=30)  # interrupted at the model
        return Reply(text="r2", tokens=10)

    asked: list[str] = []

    def summarizer(body: dict[str, Any]) -> Reply:
        asked.append(last_user(body))
        return Reply(text=f"SUMMARY#{len(asked)} mentions-one={'user: one' in asked[-1]}", tokens=3)

    model.script("w", worker)
    model.script("sum", summarizer)
    compaction = pb.Compaction(max_context_tokens=500, keep_last_turns=1, summarizer_agent="sum")
    runtime_id = await create(stub, agent("w", compaction=compaction), agent("sum"))
    handle_id, zero = await run(stub, runtime_id, "w", "zero")
    assert zero.status == pb.STATUS_DONE

    phase["run"] = 1
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="one"))
    await until(lambda: len(asked) == 1 and model.in_flight == 1, "the turn after the first compaction at the model")
    await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_INTERRUPTED  # run one is rolled back

    phase["run"] = 2
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="two " + BIG))
    assert (await wait(stub, runtime_id, handle_id)).text == "r2"
    assert len(asked) == 2 and "user: one" not in asked[1]  # summarized again, without the rolled-back run
    summaries = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "user" and "SUMMARY#" in m["content"]]
    assert summaries == ["Summary of the conversation so far:\nSUMMARY#2 mentions-one=False"]
    listed = await views(stub, runtime_id)
    assert sorted(h for h in listed if h.startswith(f"{handle_id}/")) == [f"{handle_id}/sum.1", f"{handle_id}/sum.2"]
