"""The numbers a host bills from and branches on, over a real server and a scripted HTTP model.
(Delegation's rules, the tree's figures, the team advertised, parallel task calls, are the fast
tier's: tests/domain/test_delegation.py.)"""

from __future__ import annotations

import time

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, duration, http_tool, run, status_details, views
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.tool_server import ToolServer


def delegate_then_answer(worker: str, tokens: int, answer: str = "coordinated") -> Reply | object:
    def script(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": worker, "prompt": "look around"})], tokens=tokens)
        return Reply(text=answer, tokens=tokens)

    return script


async def test_b_max_turns(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer) -> None:
    model.script("looper", lambda body: Reply(calls=[("ping", {})], tokens=10))
    looper = agent("looper", tools=[http_tool("ping", tools.url("ping"))], budget=pb.Budget(max_turns=3))
    runtime_id = await create(stub, looper)
    _, result = await run(stub, runtime_id, "looper", "go")
    assert (result.status, result.limit, result.turns) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TURNS, 3)
    assert result.own_tokens == result.total_tokens == 30
    assert tools.hits["ping"] == 3


async def test_b_completion_gate_counts_every_attempt(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("sloppy", lambda body: Reply(text="nope", tokens=25))
    gate = pb.CompletionGate(must_match="^VERIFIED", max_attempts=2)
    runtime_id = await create(stub, agent("sloppy", completion=gate))
    _, result = await run(stub, runtime_id, "sloppy", "verify it")
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_COMPLETION)
    assert "^VERIFIED" in result.text
    assert (result.turns, result.own_tokens, result.total_tokens) == (2, 50, 50)
    assert model.calls["sloppy"] == 2
    # The rejection was fed back to the model with the reason.
    assert "not accepted" in model.requests[1]["messages"][-1]["content"]


async def test_completion_gate_judge_agent(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("writer", lambda body: Reply(text=f"draft {tool_results(body)}", tokens=10))
    verdicts = iter(["FAIL too short", "PASS"])
    model.script("judge", lambda body: Reply(text=next(verdicts), tokens=5))
    writer = agent("writer", completion=pb.CompletionGate(judge_agent="judge", max_attempts=3))
    runtime_id = await create(stub, writer, agent("judge"))
    handle_id, result = await run(stub, runtime_id, "writer", "write")
    assert result.status == pb.STATUS_DONE
    assert (result.turns, result.own_tokens, result.total_tokens) == (2, 20, 30)
    listed = await views(stub, runtime_id)
    assert sorted(listed) == [handle_id, f"{handle_id}/judge.1", f"{handle_id}/judge.2"]


async def test_b_max_tokens_stops_before_the_model_call(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("spender", lambda body: Reply(text="spent", tokens=100))
    runtime_id = await create(stub, agent("spender", budget=pb.Budget(max_tokens=50)))
    handle_id, first = await run(stub, runtime_id, "spender", "one")
    assert first.status == pb.STATUS_DONE
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="two"))
    second = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result
    assert (second.status, second.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TOKENS)
    assert model.calls["spender"] == 1
    assert (second.turns, second.own_tokens) == (1, 100)


async def test_b_max_tool_calls(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer) -> None:
    model.script("caller", lambda body: Reply(calls=[("ping", {}), ("ping", {})], tokens=10))
    caller = agent("caller", tools=[http_tool("ping", tools.url("ping"))], budget=pb.Budget(max_tool_calls=3))
    runtime_id = await create(stub, caller)
    _, result = await run(stub, runtime_id, "caller", "go")
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TOOL_CALLS)
    assert (result.tool_calls, result.turns) == (3, 2)
    assert tools.hits["ping"] == 3


async def test_b_max_wall_time_cuts_the_turn_in_flight(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("slow", lambda body: Reply(text="late", tokens=10, delay=5))
    runtime_id = await create(stub, agent("slow", budget=pb.Budget(max_wall_time=duration(0.3))))
    started = time.monotonic()
    _, result = await run(stub, runtime_id, "slow", "go")
    elapsed = time.monotonic() - started
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_WALL_TIME)
    assert elapsed < 2.5, f"the result came after {elapsed:.2f}s, not at the 0.3s deadline"
    assert result.turns == 0


async def test_wall_time_is_carved_for_delegates(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("boss", delegate_then_answer("sloth", 10))  # type: ignore[arg-type]
    model.script("sloth", lambda body: Reply(text="zzz", tokens=10, delay=5))
    boss = agent("boss", team=["sloth"], budget=pb.Budget(max_wall_time=duration(0.3)))
    runtime_id = await create(stub, boss, agent("sloth"))
    handle_id, result = await run(stub, runtime_id, "boss", "go")
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_WALL_TIME)
    child = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=f"{handle_id}/sloth.1"))).result
    assert (child.status, child.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_WALL_TIME)


async def test_b_max_children(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    def lead(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "helper", "prompt": "a"}), ("task", {"agent": "helper", "prompt": "b"})])
        return Reply(text="done")

    model.script("lead", lead)
    model.script("helper", lambda body: Reply(text="helped", tokens=7))
    runtime_id = await create(stub, agent("lead", team=["helper"], budget=pb.Budget(max_children=1)), agent("helper"))
    handle_id, result = await run(stub, runtime_id, "lead", "go")
    assert result.status == pb.STATUS_DONE
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    outputs = [m for m in transcript.messages if m.role == "tool"]
    assert [m.is_error for m in outputs] == [False, True]
    assert "LIMIT_MAX_CHILDREN" in outputs[1].content
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id=handle_id, agent="helper"))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    [info] = status_details(refused.value)
    assert info.metadata["limit"] == "LIMIT_MAX_CHILDREN"
    assert len(await views(stub, runtime_id)) == 2


async def test_b_max_depth(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("top", delegate_then_answer("mid", 10))  # type: ignore[arg-type]
    model.script("mid", delegate_then_answer("leaf", 10, answer="mid done"))  # type: ignore[arg-type]
    model.script("leaf", lambda body: Reply(text="leaf done"))
    top = agent("top", team=["mid"], budget=pb.Budget(max_depth=1))
    runtime_id = await create(stub, top, agent("mid", team=["leaf"]), agent("leaf"))
    handle_id, result = await run(stub, runtime_id, "top", "go")
    assert result.status == pb.STATUS_DONE
    mid_id = f"{handle_id}/mid.1"
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=mid_id))
    [refusal] = [m for m in transcript.messages if m.role == "tool"]
    assert refusal.is_error and "LIMIT_MAX_DEPTH" in refusal.content
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id=mid_id, agent="leaf"))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    [info] = status_details(refused.value)
    assert info.metadata["limit"] == "LIMIT_MAX_DEPTH"


async def test_max_concurrent_queues_children_in_wake_order(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    def fan_out(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "worker", "prompt": f"job {i}"}) for i in range(4)])
        return Reply(text="merged")

    model.script("fan", fan_out)
    model.script("worker", lambda body: Reply(text=body["messages"][-1]["content"], delay=0.05))
    fan = agent("fan", team=["worker"], budget=pb.Budget(max_concurrent=1))
    runtime_id = await create(stub, fan, agent("worker"))
    _, result = await run(stub, runtime_id, "fan", "go")
    assert result.status == pb.STATUS_DONE
    assert model.peak_in_flight == 1
    order = [body["messages"][-1]["content"] for body in model.requests if body["model"] == "worker"]
    assert order == ["job 0", "job 1", "job 2", "job 3"]


async def test_provider_failure_is_an_error_result_without_the_key(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    model.script("broken", lambda body: Reply(status=401, raw='{"error": "bad key sk-test-secret-never-shown"}'))
    runtime_id = await create(stub, agent("broken"))
    _, result = await run(stub, runtime_id, "broken", "go")
    assert result.status == pb.STATUS_ERROR and result.is_error
    assert "401" in result.text
    assert "sk-test-secret" not in result.text
    assert model.headers[0]["Authorization"] == "Bearer sk-test-secret-never-shown"


async def test_http_tool_sends_idempotency_key_and_reports_errors(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def script(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("ping", {"n": 1}), ("fail", {})])
        return Reply(text="ok")

    model.script("user", script)
    runtime_id = await create(
        stub, agent("user", tools=[http_tool("ping", tools.url("ping")), http_tool("fail", tools.url("fail"))])
    )
    handle_id, result = await run(stub, runtime_id, "user", "go")
    assert result.status == pb.STATUS_DONE
    assert sorted(tools.keys) == [f"{runtime_id}/{handle_id}/call_1_1", f"{runtime_id}/{handle_id}/call_1_2"]
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    ping, fail = [m for m in transcript.messages if m.role == "tool"]
    assert (ping.content, ping.is_error) == ("ping ok #1", False)
    assert fail.is_error and fail.content.startswith("HTTP 503")
    assert '{"n": 1}' in tools.bodies


async def test_guardrail_deny_never_runs_the_tool(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def script(body: dict) -> Reply:  # type: ignore[type-arg]
        return Reply(calls=[("wipe", {})]) if tool_results(body) == 0 else Reply(text="could not")

    model.script("risky", script)
    rail = pb.Guardrail(tool="wipe", action=pb.GUARDRAIL_ACTION_DENY, reason="wiping is forbidden")
    runtime_id = await create(stub, agent("risky", tools=[http_tool("wipe", tools.url("wipe"))], guardrails=[rail]))
    handle_id, result = await run(stub, runtime_id, "risky", "go")
    assert result.status == pb.STATUS_DONE
    assert tools.hits["wipe"] == 0
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    [denied] = [m for m in transcript.messages if m.role == "tool"]
    assert denied.is_error and "wiping is forbidden" in denied.content
