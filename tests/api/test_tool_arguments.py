"""A tool call's arguments are checked against the tool's input_schema before anything acts on
them, whoever runs the tool: a relay call (the host) or an approval-gated one (a person) with
arguments the schema refuses never reaches them; it is an error result for the model now."""

from __future__ import annotations

from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, http_tool, run, transcript
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.tool_server import ToolServer

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def relay_tool(name: str) -> pb.ToolDef:
    tool = pb.ToolDef(name=name, description=f"the {name} tool", relay=pb.RelayTool())
    tool.input_schema.update(SCHEMA)
    return tool


def calls_then_answers(name: str, arguments: dict[str, Any]) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[(name, arguments)])
        return Reply(text=f"saw: {body['messages'][-1]['content']}")

    return script


async def test_a_relay_call_the_schema_refuses_is_an_error_result_and_suspends_nothing(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("relayer", calls_then_answers("lookup", {"n": "not a number"}))
    runtime_id = await create(stub, agent("relayer", tools=[relay_tool("lookup")]))
    handle_id, result = await run(stub, runtime_id, "relayer", "go")
    assert result.status == pb.STATUS_DONE, result
    assert not result.HasField("pending")
    assert "do not match the tool's schema" in result.text
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error and "do not match the tool's schema" in tool_message.content


async def test_a_relay_call_the_schema_accepts_suspends_for_the_host(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("relayer", calls_then_answers("lookup", {"n": 7}))
    runtime_id = await create(stub, agent("relayer", tools=[relay_tool("lookup")]))
    _, result = await run(stub, runtime_id, "relayer", "go")
    assert (result.status, result.pending.kind) == (pb.STATUS_PENDING, "tool_call")
    assert [call.name for call in result.pending.calls] == ["lookup"]


async def test_an_approval_gated_call_the_schema_refuses_asks_nobody(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    gated = http_tool("commit", tools.url("commit"), SCHEMA)
    gated.approval.CopyFrom(pb.ApprovalPolicy(required=True, prompt="Commit?"))
    model.script("committer", calls_then_answers("commit", {"n": 1, "extra": True}))
    runtime_id = await create(stub, agent("committer", tools=[gated]))
    _, result = await run(stub, runtime_id, "committer", "go")
    assert result.status == pb.STATUS_DONE, result
    assert "do not match the tool's schema" in result.text
    assert tools.hits["commit"] == 0
