"""Regressions from a review of the domain layer: what Close, Interrupt and Resume leave
behind, a completion judge or a summarizer that suspends, and the figures a Resume, a
restart or a rolled-back run must not reset."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import Closed, Tree, replay
from google.rpc import error_details_pb2

from tests.support.build import agent, create, duration, run, spawn, status_details, transcript, views, wait
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.poll import until
from tests.support.servers import Served, serve

RELAY = pb.ToolDef(name="fetch", description="the host's fetch", relay=pb.RelayTool())
BIG = "x" * 2400


async def resume(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, answer: pb.Answer, timeout: float = 60) -> pb.TaskResult:
    return (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer), timeout=timeout)).result


def relay_answer(request: pb.Request, output: str = "fetched") -> pb.Answer:
    return pb.Answer(id=request.id, ok=True, outputs=[pb.ToolOutput(call_id=request.calls[0].id, output=output)])


async def state_of(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> pb.HandleState.ValueType:
    return (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle.state


async def until_state(
    stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str, state: pb.HandleState.ValueType
) -> None:
    """Polls Inspect (an RPC: `until` takes a plain condition) until the handle is in `state`."""
    for _ in range(2000):
        if await state_of(stub, runtime_id, handle_id) == state:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{handle_id} never reached {pb.HandleState.Name(state)}")


def coordinator_of(*prompts: str, delay: float = 0.0) -> Any:
    """A coordinator that delegates one task per prompt to `worker`, then says it is done."""

    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "worker", "prompt": p}) for p in prompts], tokens=10, delay=delay)
        return Reply(text="coordinated", tokens=10)

    return script


# ---- 1. a closed handle's result carries no limit -----------------------------------------


async def test_a_closed_handles_result_has_no_limit(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    model.script("looper", lambda body: Reply(calls=[("nothing", {})], tokens=10))
    runtime_id = await create(stub, agent("looper"))
    handle_id, result = await run(stub, runtime_id, "looper", "go", budget=pb.Budget(max_turns=1))
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TURNS)

    await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id))
    closed = await wait(stub, runtime_id, handle_id)
    # `limit` is set iff INCOMPLETE; the text and the figures of the last run stay.
    assert (closed.status, closed.limit, closed.is_error) == (pb.STATUS_CLOSED, pb.LIMIT_UNSPECIFIED, False)
    assert (closed.text, closed.turns, closed.own_tokens) == (result.text, 1, 10)
    assert not closed.HasField("pending") and not closed.HasField("failure")


# ---- 2. Close with a grace closes what was spawned during the grace -------------------------


async def test_close_with_a_grace_closes_children_spawned_during_it(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("coordinator", coordinator_of("w", delay=0.3))  # it delegates only once the grace began
    model.script("worker", lambda body: Reply(text="worked", tokens=5))
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker"))
    handle_id = await spawn(stub, runtime_id, "coordinator")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))

    closed = await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id, grace=duration(5)))
    worker = f"{handle_id}/worker.1"
    assert set(closed.closed_handle_ids) == {handle_id, worker}
    listed = await views(stub, runtime_id)
    assert {listed[h].state for h in (handle_id, worker)} == {pb.HANDLE_STATE_CLOSED}
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=worker, prompt="again"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert model.calls["worker"] == 1


async def test_wake_under_a_closed_ancestor_is_refused(served: Served, model: ScriptedModelServer) -> None:
    """A child left open under a closed parent (a store written before Close re-listed the
    subtree after its grace) cannot be woken to run under it."""
    stub = cast("pb_grpc.AgentRuntimeAsyncStub", served.stub)
    model.script("coordinator", lambda body: Reply(text="coordinated", tokens=10))
    model.script("worker", lambda body: Reply(text="worked", tokens=5))
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker"))
    parent = await spawn(stub, runtime_id, "coordinator")
    child = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id=parent, agent="worker"))).handle_id
    runtime = await served.running.service.runtime(runtime_id)
    await runtime.journal.record(Closed(parent))  # the parent alone, as such a store holds it

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=child, prompt="work"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"closed subtree of {parent!r}" in (refused.value.details() or "")
    infos = [d for d in status_details(refused.value) if isinstance(d, error_details_pb2.ErrorInfo)]
    assert [info.reason for info in infos] == ["HANDLE_CLOSED"]
    assert model.calls["worker"] == 0


# ---- 3. a judge or a summarizer that suspends suspends its handle -------------------------


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


# ---- 4, 5. Interrupt withdraws the whole subtree ------------------------------------------


async def test_interrupting_a_running_parent_withdraws_its_suspended_child(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    def worker(body: dict[str, Any]) -> Reply:
        if last_user(body) == "fast" and tool_results(body) == 0:
            return Reply(calls=[("fetch", {})], tokens=5)
        return Reply(text="w", tokens=5, delay=30 if last_user(body) == "slow" else 0)

    model.script("coordinator", coordinator_of("fast", "slow"))
    model.script("worker", worker)
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[RELAY]))
    handle_id = await spawn(stub, runtime_id, "coordinator")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    fast, slow = f"{handle_id}/worker.1", f"{handle_id}/worker.2"
    await until_state(stub, runtime_id, fast, pb.HANDLE_STATE_SUSPENDED)
    pending = (await wait(stub, runtime_id, fast)).pending

    assert (await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))).interrupted
    assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_INTERRUPTED
    listed = await views(stub, runtime_id)
    assert {h: listed[h].state for h in (handle_id, fast, slow)} == dict.fromkeys((handle_id, fast, slow), pb.HANDLE_STATE_IDLE)
    withdrawn = await wait(stub, runtime_id, fast)
    assert (withdrawn.status, withdrawn.text) == (pb.STATUS_INTERRUPTED, "the pending tool_call request was cancelled")
    # Its Request is no longer live: nothing could continue it under a rolled-back task call.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await resume(stub, runtime_id, relay_answer(pending))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    messages = await transcript(stub, runtime_id, fast)
    assert [m.role for m in messages] == ["user", "assistant", "tool"]  # the fetch call has its answer


async def test_interrupting_a_suspended_parent_stops_the_child_a_resume_continues(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    def worker(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("fetch", {})], tokens=5)
        return Reply(text="worker finished", tokens=5, delay=30)

    model.script("coordinator", coordinator_of("w"))
    model.script("worker", worker)
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker", tools=[RELAY]))
    handle_id, pending = await run(stub, runtime_id, "coordinator", "go")
    assert pending.status == pb.STATUS_PENDING
    worker_id = f"{handle_id}/worker.1"
    resuming = stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=relay_answer(pending.pending)), timeout=60)
    await until(lambda: model.in_flight == 1, "the worker's resumed turn at the model")
    assert (await state_of(stub, runtime_id, worker_id), await state_of(stub, runtime_id, handle_id)) == (
        pb.HANDLE_STATE_RUNNING,
        pb.HANDLE_STATE_SUSPENDED,
    )

    assert (await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))).interrupted
    listed = await views(stub, runtime_id)
    assert (listed[worker_id].state, listed[handle_id].state) == (pb.HANDLE_STATE_IDLE, pb.HANDLE_STATE_IDLE)
    resumed = (await resuming).result  # the topmost handle it continued: the worker, interrupted
    assert (resumed.handle_id, resumed.status) == (worker_id, pb.STATUS_INTERRUPTED)
    assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_INTERRUPTED
    assert (await wait(stub, runtime_id, worker_id)).status == pb.STATUS_INTERRUPTED
    assert model.calls["coordinator"] == 1  # the coordinator was not continued on the interrupted result


# ---- 6. a retried Resume answers what the first answered -----------------------------------


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
    model.script("coordinator", coordinator_of("fast", "slow"))
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
    model.script("coordinator", coordinator_of("fast", "slow"))
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


# ---- 7. the completion gate counts its rejections over a Resume ----------------------------


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


# ---- 8. a compaction after a rolled-back run gets a summarizer of its own ------------------


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
