"""A host that creates runtimes of the same agents again and again (a runtime a task or a
conversation) has them decoded, checked and compiled once: the runtimes share one decoded copy,
and each is still checked for what is its own (its options), and runs as if alone. Definitions
that change, or have a fault, are decoded and checked again (api/definitions_memo.py)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import RunningServer
from agentruntime_server.domain.runtime.runtime import Runtime

from tests.support.build import agent, create, http_tool, run, transcript
from tests.support.calls import bad_request_fields
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.tool_server import ToolServer

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _definitions(tools: ToolServer, instructions: str = "Count.") -> list[pb.AgentDef]:
    return [
        agent("lead", team=["counter"]),
        agent("counter", instructions=instructions, tools=[http_tool("count", tools.url("count"), SCHEMA)]),
    ]


def _runtime(server: RunningServer, runtime_id: str) -> Runtime:
    return server.service.cache.runtimes[runtime_id]


async def test_runtimes_of_the_same_definitions_share_one_decoded_copy_and_run_apart(
    stub: pb_grpc.AgentRuntimeAsyncStub, server: RunningServer, model: ScriptedModelServer, tools: ToolServer
) -> None:
    def counter(body: dict[str, Any]) -> Reply:
        # The first call's arguments fail the schema (the model sees why), the second pass.
        done = tool_results(body)
        if done < 2:
            return Reply(calls=[("count", {"n": "one"} if done == 0 else {"n": 1})])
        return Reply(text=f"counted after {done} results")

    model.script("counter", counter)
    first, second = [await create(stub, *_definitions(tools)) for _ in range(2)]
    changed = await create(stub, *_definitions(tools, instructions="Count again."))
    shared = [_runtime(server, runtime_id).tree.agents["counter"] for runtime_id in (first, second, changed)]
    assert shared[0] is shared[1] and shared[0] is not shared[2]
    assert shared[2].instructions == "Count again."

    for runtime_id in (first, second):
        handle_id, result = await run(stub, runtime_id, "counter", "count once")
        assert (result.status, result.text) == (pb.STATUS_DONE, "counted after 2 results"), result
        tool_messages = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
        assert [m.is_error for m in tool_messages] == [True, False]
        assert "do not match the tool's schema" in tool_messages[0].content
    assert tools.hits["count"] == 2  # one call a runtime reached the tool: the one that passed


async def test_a_runtime_of_definitions_checked_before_still_has_its_own_options_checked(
    stub: pb_grpc.AgentRuntimeAsyncStub, server: RunningServer, tools: ToolServer
) -> None:
    await create(stub, *_definitions(tools))
    before = len(server.service.cache.runtimes)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.CreateRuntime(
            pb.CreateRuntimeRequest(agents=_definitions(tools), options=pb.RuntimeOptions(inbox_capacity=1_000_000))
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(refused.value) == ["options.inbox_capacity"]
    assert len(server.service.cache.runtimes) == before
    listed = await stub.ListRuntimes(pb.ListRuntimesRequest())
    assert len(listed.runtimes) == before


async def test_definitions_with_a_fault_are_refused_each_time_they_come(
    stub: pb_grpc.AgentRuntimeAsyncStub, server: RunningServer, tools: ToolServer
) -> None:
    wrong = [*_definitions(tools)[:1], agent("counter", tools=[http_tool("count", "file:///etc/passwd")])]
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await create(stub, *wrong)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(refused.value) == ["agents[1].tools[0].http.url"]
    assert len(server.service.cache.runtimes) == 0
    assert await create(stub, *_definitions(tools))  # the same definitions, mended
