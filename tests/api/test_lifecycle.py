"""Interrupt, Close, Wait timeouts and the inbox, over a real server."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, duration, run, views
from tests.support.model_server import Reply, ScriptedModelServer, tool_results


async def _until_model_called(model: ScriptedModelServer, name: str, times: int = 1) -> None:
    for _ in range(500):
        if model.calls[name] >= times:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"model {name} was never called {times} times")


async def test_interrupt_running_turn_restores_the_inbox(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("slow", lambda body: Reply(text="late", tokens=10, delay=5))
    runtime_id = await create(stub, agent("slow"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="slow"))).handle_id
    for text in ("first", "second"):
        await stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text=text, channel="ops", sender="alice"))
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="work"))
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert (view.state, view.inbox_size) == (pb.HANDLE_STATE_RUNNING, 0)
    await _until_model_called(model, "slow")
    block = model.requests[0]["messages"][-1]["content"]
    assert "[from alice on #ops] first" in block and "[from alice on #ops] second" in block

    interrupted = await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert interrupted.interrupted
    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert result.status == pb.STATUS_INTERRUPTED
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert (view.state, view.inbox_size) == (pb.HANDLE_STATE_IDLE, 2)
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert list(transcript.messages) == []
    again = await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert not again.interrupted


async def test_interrupt_cascades_to_the_subtree(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("boss", lambda body: Reply(calls=[("task", {"agent": "slow", "prompt": "x"})], tokens=10))
    model.script("slow", lambda body: Reply(text="late", delay=5))
    runtime_id = await create(stub, agent("boss", team=["slow"]), agent("slow"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="boss"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    await _until_model_called(model, "slow")
    await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))
    child = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=f"{handle_id}/slow.1"))).result
    assert child.status == pb.STATUS_INTERRUPTED
    root = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert root.status == pb.STATUS_INTERRUPTED
    assert root.total_tokens == 10  # what was spent stays counted


async def test_interrupting_a_child_lets_the_parent_go_on(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    def boss(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "slow", "prompt": "x"})], tokens=10)
        return Reply(text="went on: " + body["messages"][-1]["content"], tokens=10)

    model.script("boss", boss)
    model.script("slow", lambda body: Reply(text="late", delay=5))
    runtime_id = await create(stub, agent("boss", team=["slow"]), agent("slow"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="boss"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    await _until_model_called(model, "slow")
    await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=f"{handle_id}/slow.1"))
    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert result.status == pb.STATUS_DONE
    assert "INTERRUPTED" in result.text


async def test_close_cascades_leaf_first_and_keeps_the_last_result(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    def coordinator(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "explore", "prompt": "look"})], tokens=100)
        return Reply(text="coordinated", tokens=100)

    model.script("coordinator", coordinator)
    model.script("explore", lambda body: Reply(text="found", tokens=400))
    runtime_id = await create(stub, agent("coordinator", team=["explore"]), agent("explore"))
    handle_id, _ = await run(stub, runtime_id, "coordinator", "go")

    closed = await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert list(closed.closed_handle_ids) == [f"{handle_id}/explore.1", handle_id]
    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert (result.status, result.text, result.total_tokens) == (pb.STATUS_CLOSED, "coordinated", 600)
    assert all(view.state == pb.HANDLE_STATE_CLOSED for view in (await views(stub, runtime_id)).values())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="again"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_close_a_running_handle_needs_force(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("slow", lambda body: Reply(text="late", delay=5))
    runtime_id = await create(stub, agent("slow"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="slow"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "force" in (refused.value.details() or "")
    closed = await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id, force=True))
    assert list(closed.closed_handle_ids) == [handle_id]
    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert result.status == pb.STATUS_CLOSED


async def test_wait_timeout_leaves_the_handle_running(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("slowish", lambda body: Reply(text="finally", tokens=10, delay=0.6))
    runtime_id = await create(stub, agent("slowish"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="slowish"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    early = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id, timeout=duration(0.05)))).result
    assert early.status == pb.STATUS_TIMEOUT
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert view.state == pb.HANDLE_STATE_RUNNING
    final = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert (final.status, final.text, final.own_tokens) == (pb.STATUS_DONE, "finally", 10)


async def test_wake_drains_only_the_inbox(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("reader", lambda body: Reply(text="read", tokens=3))
    runtime_id = await create(stub, agent("reader"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="reader"))).handle_id
    posted = await stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="news"))
    assert (posted.ok, posted.inbox_size) == (True, 1)
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id))
    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert result.status == pb.STATUS_DONE
    assert model.requests[0]["messages"][-1]["content"] == "Messages received:\n[from host] news"
