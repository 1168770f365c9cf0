"""The numbers a host bills from and branches on, over a real server and a scripted HTTP model:
a tree's figures in results and views, the task tool a provider is sent, a wall time that cuts
the call in flight, a refused Spawn's ErrorInfo, a provider failure without its key, an http
tool's idempotency key. What each limit, the completion gate and guardrails do is the fast
tier's: tests/domain/test_budget_limits.py, test_completion_gate.py, test_turn_outcomes.py."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, duration, http_tool, run, status_details, views
from tests.support.model_server import Reply, Script, ScriptedModelServer, tool_results
from tests.support.tool_server import ToolServer


def delegate_then_answer(worker: str, tokens: int, answer: str = "coordinated") -> Script:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": worker, "prompt": "look around"})], tokens=tokens)
        return Reply(text=answer, tokens=tokens)

    return script


async def test_a_tree_total_counts_every_delegate(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    model.script("coordinator", delegate_then_answer("explore", 100))
    model.script("explore", lambda body: Reply(text="found it", tokens=400))
    runtime_id = await create(stub, agent("coordinator", team=["explore"]), agent("explore"))

    handle_id, result = await run(stub, runtime_id, "coordinator", "map the repo")

    assert handle_id == "root/coordinator.1"
    assert result.status == pb.STATUS_DONE
    assert result.limit == pb.LIMIT_UNSPECIFIED
    assert result.text == "coordinated"
    assert (result.total_tokens, result.own_tokens, result.turns, result.tool_calls) == (600, 200, 2, 1)
    listed = await views(stub, runtime_id)
    explore = listed["root/coordinator.1/explore.1"]
    assert (explore.own_tokens, explore.total_tokens, explore.turns) == (400, 400, 1)
    assert explore.parent_id == "root/coordinator.1"
    assert explore.state == pb.HANDLE_STATE_IDLE
    assert listed["root/coordinator.1"].total_tokens == 600


async def test_task_tool_advertises_only_the_team_sorted(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    model.script("lead", lambda body: Reply(text="ok"))
    runtime_id = await create(stub, agent("lead", team=["zeta", "alpha"]), agent("zeta"), agent("alpha"), agent("outsider"))
    await run(stub, runtime_id, "lead", "go")
    task = next(tool for tool in model.requests[0]["tools"] if tool["function"]["name"] == "task")
    assert task["function"]["parameters"]["properties"]["agent"]["enum"] == ["alpha", "zeta"]
    assert "outsider" not in task["function"]["description"]


async def test_b_max_wall_time_cuts_the_turn_in_flight(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    model.script("slow", lambda body: Reply(text="late", tokens=10, delay=5))
    runtime_id = await create(stub, agent("slow", budget=pb.Budget(max_wall_time=duration(0.3))))
    started = time.monotonic()
    _, result = await run(stub, runtime_id, "slow", "go")
    elapsed = time.monotonic() - started
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_WALL_TIME)
    assert elapsed < 2.5, f"the result came after {elapsed:.2f}s, not at the 0.3s deadline"
    assert result.turns == 0


async def test_b_max_children(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    def lead(body: dict[str, Any]) -> Reply:
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


async def test_provider_failure_is_an_error_result_without_the_key(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("broken", lambda body: Reply(status=401, raw='{"error": "bad key sk-test-secret-never-shown"}'))
    runtime_id = await create(stub, agent("broken"))
    _, result = await run(stub, runtime_id, "broken", "go")
    assert result.status == pb.STATUS_ERROR and result.is_error
    assert "401" in result.text
    assert "sk-test-secret" not in result.text
    assert model.headers[0]["Authorization"] == "Bearer sk-test-secret-never-shown"


async def test_http_tool_sends_idempotency_key_and_reports_errors(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def script(body: dict[str, Any]) -> Reply:
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
