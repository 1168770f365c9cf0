"""Typed results (docs/typed-results.md): an agent with an output_schema answers JSON the
runtime validates; the providers are asked for it natively; a wrong answer goes back to the
model with the reason, as an attempt of the completion gate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from google.protobuf import json_format
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from pydantic import TypeAdapter

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.build import agent, create, run, status_details, transcript
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.typed import CLASSIFICATION

SCHEMA = CLASSIFICATION
GOOD = {"label": "bug", "confidence": 0.75, "tags": ["crash", "ui"]}


def typed(name: str, schema: dict[str, Any] | None = None, **fields: Any) -> pb.AgentDef:
    definition = agent(name, **fields)
    definition.output_schema.update(schema or SCHEMA)
    return definition


def output_of(result: pb.TaskResult) -> Any:
    return json_format.MessageToDict(result.output) if result.HasField("output") else None


@pytest.fixture
async def stub(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    from tests.support.servers import serve

    providers = {"anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": "sk-ant-test"}}
    async with serve(llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", providers=providers) as served:
        yield served.stub


async def test_a_wrong_answer_goes_back_with_the_reason_and_the_second_wins(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    answers = iter(['{"label": "bug", "confidence": 1.5, "tags": []}', json.dumps(GOOD)])
    model.script("classifier", lambda body: Reply(text=next(answers), tokens=10))
    runtime_id = await create(stub, typed("classifier"))
    handle_id, result = await run(stub, runtime_id, "classifier", "The app crashes when I click Save.")
    assert (result.status, result.turns, result.limit) == (pb.STATUS_DONE, 2, pb.LIMIT_UNSPECIFIED)
    assert output_of(result) == GOOD and json.loads(result.text) == GOOD
    feedback = (await transcript(stub, runtime_id, handle_id))[-2]
    assert feedback.role == "user" and "does not match the output schema" in feedback.content
    assert "1.5 is greater than the maximum of 1" in feedback.content
    body = model.requests[0]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}}
    TypeAdapter(CompletionCreateParamsNonStreaming).validate_python(body)  # the SDK's own request type


async def test_a_schema_strict_mode_does_not_take_is_sent_with_strict_false(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    loose = {"type": "object", "properties": {"n": {"type": "integer"}}}  # open, n optional
    model.script("loose", lambda body: Reply(text='{"n": 3}'))
    runtime_id = await create(stub, typed("loose", loose))
    _, result = await run(stub, runtime_id, "loose", "count")
    assert output_of(result) == {"n": 3}
    assert model.requests[-1]["response_format"]["json_schema"]["strict"] is False


async def test_anthropic_is_asked_through_output_config(
    stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer
) -> None:
    anthropic.script("claude-test", lambda body: Turn(text=json.dumps(GOOD)))
    runtime_id = await create(stub, typed("claude", model="claude-test", provider="anthropic"))
    _, result = await run(stub, runtime_id, "claude", "Classify.")
    assert output_of(result) == GOOD
    body = anthropic.requests[-1]
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    TypeAdapter(MessageCreateParamsNonStreaming).validate_python(body)


async def test_the_scripted_model_answers_structured_replies(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    script = pb.Script(replies=[pb.ScriptedReply(text=json.dumps(GOOD))])
    runtime_id = await create(stub, typed("offline", script=script))
    _, result = await run(stub, runtime_id, "offline", "classify")
    assert output_of(result) == GOOD


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "string"}, '"type": "object" at the top'),
        ({"properties": {}}, '"type": "object" at the top'),
        # OpenAI's structured outputs refuse any other root (HTTP 400): a list goes in a property.
        ({"type": "array", "items": {"type": "string"}}, 'put a list in a property: {"type": "object", "properties"'),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}, "outside the schema"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}, "pattern"),
        ({"type": "object", "properties": {"a": {"type": "nope"}}}, "not a valid JSON Schema"),
    ],
)
async def test_a_hostile_output_schema_is_refused_with_its_field(
    stub: pb_grpc.AgentRuntimeAsyncStub, schema: dict[str, Any], says: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, typed("bad", schema))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    [violation] = [v for detail in status_details(refused.value) for v in getattr(detail, "field_violations", [])]
    assert violation.field == "agents[0].output_schema" and says in violation.description


async def test_a_structured_tool_output_reaches_the_model_as_json(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    """A worker's (over ServeTools) and a host's (a relay tool's, in a Resume) `ToolOutput.structured`."""

    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("lookup", {"q": "streams"})])
        return Reply(text=body["messages"][-1]["content"])

    model.script("asker", script)
    relay = pb.ToolDef(name="lookup", description="looks up", relay=pb.RelayTool())
    runtime_id = await create(stub, agent("asker", tools=[relay]))
    _, pending = await run(stub, runtime_id, "asker", "look")
    structured = json_format.ParseDict({"hits": [1, 2], "source": "index"}, pb.ToolOutput().structured)
    call = pending.pending.calls[0]
    answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, structured=structured)])
    resumed = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
    assert json.loads(resumed.text) == {"hits": [1, 2], "source": "index"}

    worker_tool = pb.ToolDef(name="lookup", description="looks up", worker=pb.WorkerTool(queue="typed"))
    runtime_id = await create(stub, agent("asker", tools=[worker_tool]))
    outputs: asyncio.Queue[pb.ServeToolsRequest] = asyncio.Queue()
    await outputs.put(pb.ServeToolsRequest(registration=pb.WorkerRegistration(queue="typed", tools=["lookup"])))

    async def requests() -> AsyncIterator[pb.ServeToolsRequest]:
        while True:
            yield await outputs.get()

    serving = stub.ServeTools(requests())
    assert (await anext(aiter(serving))).HasField("registered")
    running = asyncio.ensure_future(run(stub, runtime_id, "asker", "look"))
    dispatched = await anext(aiter(serving))
    value = json_format.ParseDict({"hits": [3]}, pb.ToolOutput().structured)
    await outputs.put(pb.ServeToolsRequest(output=pb.ToolOutput(call_id=dispatched.call.id, structured=value)))
    _, result = await running
    serving.cancel()
    assert json.loads(result.text) == {"hits": [3]}
