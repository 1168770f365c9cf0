"""Bad input: the canonical code, an actionable message, and nothing changed.

One row per mistake; add a row to extend. `call` gets a Ctx with a runtime `base` holding
an idle handle, a closed handle and a handle whose inbox is full."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2

from tests.support.build import agent, duration, http_tool, status_details

Code = grpc.StatusCode


@dataclass
class Ctx:
    stub: pb_grpc.AgentRuntimeAsyncStub
    idle: str
    closed: str
    full: str


@dataclass(frozen=True)
class Row:
    name: str
    call: Callable[[Ctx], Awaitable[Any]]
    code: grpc.StatusCode
    says: str  # a phrase the message must hold
    field: str = ""  # for INVALID_ARGUMENT: the field violation's path


def create(*agents: pb.AgentDef, runtime_id: str = "fresh") -> Callable[[Ctx], Awaitable[Any]]:
    return lambda ctx: ctx.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=list(agents)))


URL = "http://127.0.0.1:9/tool"
tool = http_tool("lookup", URL)
schema_tool = pb.ToolDef(name="lookup", http=pb.HttpTool(url=URL))
schema_tool.input_schema.update({"type": 12})
array_tool = pb.ToolDef(name="lookup", http=pb.HttpTool(url=URL))
array_tool.input_schema.update({"type": "array"})

ROWS = [
    Row("no agents", create(), Code.INVALID_ARGUMENT, "at least one agent", "agents"),
    Row("duplicate agent", create(agent("a"), agent("a")), Code.INVALID_ARGUMENT, "duplicate agent name", "agents[1].name"),
    Row("bad agent name", create(agent("no spaces")), Code.INVALID_ARGUMENT, "not a valid agent name", "agents[0].name"),
    Row(
        "duplicate tool",
        create(agent("a", tools=[tool, tool])),
        Code.INVALID_ARGUMENT,
        "duplicate tool",
        "agents[0].tools[1].name",
    ),
    Row(
        "tool named task",
        create(agent("a", tools=[http_tool("task", URL)])),
        Code.INVALID_ARGUMENT,
        "built-in",
        "agents[0].tools[0].name",
    ),
    Row(
        "tool named ask",
        create(agent("a", tools=[http_tool("ask", URL)])),
        Code.INVALID_ARGUMENT,
        "built-in",
        "agents[0].tools[0].name",
    ),
    Row(
        "unknown team mate",
        create(agent("a", team=["ghost"])),
        Code.INVALID_ARGUMENT,
        "unknown agent 'ghost'",
        "agents[0].team[0]",
    ),
    Row(
        "invalid schema",
        create(agent("a", tools=[schema_tool])),
        Code.INVALID_ARGUMENT,
        "not a valid JSON Schema",
        "agents[0].tools[0].input_schema",
    ),
    Row(
        "non-object schema",
        create(agent("a", tools=[array_tool])),
        Code.INVALID_ARGUMENT,
        "'object'",
        "agents[0].tools[0].input_schema",
    ),
    Row(
        "bad url",
        create(agent("a", tools=[http_tool("t", "not a url")])),
        Code.INVALID_ARGUMENT,
        "absolute http(s) URL",
        "agents[0].tools[0].http.url",
    ),
    Row(
        "ftp url",
        create(agent("a", tools=[http_tool("t", "ftp://x/y")])),
        Code.INVALID_ARGUMENT,
        "absolute http(s) URL",
        "agents[0].tools[0].http.url",
    ),
    Row(
        "bad regex",
        create(agent("a", completion=pb.CompletionGate(must_match="(unclosed"))),
        Code.INVALID_ARGUMENT,
        "invalid regular expression",
        "agents[0].completion.must_match",
    ),
    Row(
        "unknown judge",
        create(agent("a", completion=pb.CompletionGate(judge_agent="ghost"))),
        Code.INVALID_ARGUMENT,
        "unknown agent",
        "agents[0].completion.judge_agent",
    ),
    Row(
        "negative budget",
        create(agent("a", budget=pb.Budget(max_turns=-1))),
        Code.INVALID_ARGUMENT,
        "must be >= 0",
        "agents[0].budget.max_turns",
    ),
    Row(
        "negative cost budget",
        create(agent("a", budget=pb.Budget(max_cost=-1))),
        Code.INVALID_ARGUMENT,
        "must be >= 0",
        "agents[0].budget.max_cost",
    ),
    Row(
        "scripted reasoning above output",
        create(agent("a", script=pb.Script(replies=[pb.ScriptedReply(usage=pb.Usage(output_tokens=2, reasoning_tokens=3))]))),
        Code.INVALID_ARGUMENT,
        "at most output_tokens",
        "agents[0].script.replies[0].usage.reasoning_tokens",
    ),
    Row(
        "scripted tokens that are not the usage's sum",
        create(agent("a", script=pb.Script(replies=[pb.ScriptedReply(tokens=9, usage=pb.Usage(input_tokens=2))]))),
        Code.INVALID_ARGUMENT,
        "the usage's sum (2)",
        "agents[0].script.replies[0].tokens",
    ),
    Row(
        "negative scripted usage",
        create(agent("a", script=pb.Script(replies=[pb.ScriptedReply(usage=pb.Usage(cache_read_tokens=-1))]))),
        Code.INVALID_ARGUMENT,
        "must be between 0",
        "agents[0].script.replies[0].usage.cache_read_tokens",
    ),
    Row(
        "zero concurrency",
        create(agent("a", budget=pb.Budget(max_concurrent=0))),
        Code.INVALID_ARGUMENT,
        "must be >= 1",
        "agents[0].budget.max_concurrent",
    ),
    Row(
        "negative wall time",
        create(agent("a", budget=pb.Budget(max_wall_time=duration(-1)))),
        Code.INVALID_ARGUMENT,
        "positive duration",
        "agents[0].budget.max_wall_time",
    ),
    Row(
        "guardrail without action",
        create(agent("a", tools=[tool], guardrails=[pb.Guardrail(tool="lookup")])),
        Code.INVALID_ARGUMENT,
        "GUARDRAIL_ACTION_DENY",
        "agents[0].guardrails[0].action",
    ),
    Row(
        "guardrail on unknown tool",
        create(agent("a", guardrails=[pb.Guardrail(tool="nope", action=pb.GUARDRAIL_ACTION_DENY)])),
        Code.INVALID_ARGUMENT,
        "has no tool 'nope'",
        "agents[0].guardrails[0].tool",
    ),
    Row(
        "runtime id not a slug",
        create(agent("a"), runtime_id="has space"),
        Code.INVALID_ARGUMENT,
        "not a plain slug",
        "runtime_id",
    ),
    Row(
        "runtime id with a path", create(agent("a"), runtime_id="../etc"), Code.INVALID_ARGUMENT, "not a plain slug", "runtime_id"
    ),
    Row("runtime id exists", create(agent("a"), runtime_id="base"), Code.ALREADY_EXISTS, "already exists"),
    Row(
        "spawn: no runtime id",
        lambda c: c.stub.Spawn(pb.SpawnRequest(agent="worker")),
        Code.INVALID_ARGUMENT,
        "is required",
        "runtime_id",
    ),
    Row(
        "spawn: unknown runtime",
        lambda c: c.stub.Spawn(pb.SpawnRequest(runtime_id="nope", agent="worker")),
        Code.NOT_FOUND,
        "runtime 'nope' not found",
    ),
    Row(
        "spawn: unknown agent",
        lambda c: c.stub.Spawn(pb.SpawnRequest(runtime_id="base", agent="ghost")),
        Code.NOT_FOUND,
        "agent 'ghost' not found",
    ),
    Row(
        "spawn: unknown parent",
        lambda c: c.stub.Spawn(pb.SpawnRequest(runtime_id="base", parent_id="root/x.9", agent="worker")),
        Code.NOT_FOUND,
        "handle 'root/x.9' not found",
    ),
    Row(
        "spawn: negative budget",
        lambda c: c.stub.Spawn(pb.SpawnRequest(runtime_id="base", agent="worker", budget=pb.Budget(max_tokens=-5))),
        Code.INVALID_ARGUMENT,
        "must be >= 0",
        "budget.max_tokens",
    ),
    Row(
        "spawn under a closed handle",
        lambda c: c.stub.Spawn(pb.SpawnRequest(runtime_id="base", parent_id=c.closed, agent="worker")),
        Code.FAILED_PRECONDITION,
        "closed",
    ),
    Row(
        "wake: unknown handle",
        lambda c: c.stub.Wake(pb.WakeRequest(runtime_id="base", handle_id="root/ghost.1", prompt="x")),
        Code.NOT_FOUND,
        "handle 'root/ghost.1' not found",
    ),
    Row(
        "wake: closed handle",
        lambda c: c.stub.Wake(pb.WakeRequest(runtime_id="base", handle_id=c.closed, prompt="x")),
        Code.FAILED_PRECONDITION,
        "is closed",
    ),
    Row(
        "wake: nothing to run on",
        lambda c: c.stub.Wake(pb.WakeRequest(runtime_id="base", handle_id=c.idle)),
        Code.INVALID_ARGUMENT,
        "nothing to run on",
        "prompt",
    ),
    Row(
        "post: full inbox",
        lambda c: c.stub.Post(pb.PostRequest(runtime_id="base", handle_id=c.full, text="one more")),
        Code.RESOURCE_EXHAUSTED,
        "inbox",
    ),
    Row(
        "post: empty text",
        lambda c: c.stub.Post(pb.PostRequest(runtime_id="base", handle_id=c.idle)),
        Code.INVALID_ARGUMENT,
        "non-empty",
        "text",
    ),
    Row(
        "post: closed handle",
        lambda c: c.stub.Post(pb.PostRequest(runtime_id="base", handle_id=c.closed, text="x")),
        Code.FAILED_PRECONDITION,
        "closed",
    ),
    Row(
        "wait: never woken",
        lambda c: c.stub.Wait(pb.WaitRequest(runtime_id="base", handle_id=c.idle)),
        Code.FAILED_PRECONDITION,
        "never been woken",
    ),
    Row(
        "wait: negative timeout",
        lambda c: c.stub.Wait(pb.WaitRequest(runtime_id="base", handle_id=c.idle, timeout=duration(-1))),
        Code.INVALID_ARGUMENT,
        "negative",
        "timeout",
    ),
    Row(
        "inspect: no handle id",
        lambda c: c.stub.Inspect(pb.InspectRequest(runtime_id="base")),
        Code.INVALID_ARGUMENT,
        "is required",
        "handle_id",
    ),
    Row("list: unknown runtime", lambda c: c.stub.List(pb.ListRequest(runtime_id="nope")), Code.NOT_FOUND, "CreateRuntime"),
    Row(
        "resume: unknown request",
        lambda c: c.stub.Resume(pb.ResumeRequest(runtime_id="base", answer=pb.Answer(id="req-x", ok=True))),
        Code.FAILED_PRECONDITION,
        "no live request",
    ),
    Row(
        "resume: no answer id",
        lambda c: c.stub.Resume(pb.ResumeRequest(runtime_id="base")),
        Code.INVALID_ARGUMENT,
        "is required",
        "answer.id",
    ),
]


async def _state(stub: pb_grpc.AgentRuntimeAsyncStub) -> tuple[Any, ...]:
    listed = await stub.List(pb.ListRequest(runtime_id="base"))
    try:
        await stub.List(pb.ListRequest(runtime_id="fresh"))
        fresh_exists = True
    except grpc.aio.AioRpcError:
        fresh_exists = False
    return (*(view.SerializeToString(deterministic=True) for view in listed.handles), fresh_exists)


@pytest.fixture
async def ctx(stub: pb_grpc.AgentRuntimeAsyncStub) -> Ctx:
    await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="base", agents=[agent("worker", model="worker")]))

    async def spawn() -> str:
        return (await stub.Spawn(pb.SpawnRequest(runtime_id="base", parent_id="root", agent="worker"))).handle_id

    idle, closed, full = await spawn(), await spawn(), await spawn()
    await stub.Close(pb.CloseRequest(runtime_id="base", handle_id=closed))
    for n in range(3):  # the test server's inbox holds 3
        await stub.Post(pb.PostRequest(runtime_id="base", handle_id=full, text=f"m{n}"))
    return Ctx(stub, idle, closed, full)


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
async def test_bad_input_is_refused_and_changes_nothing(ctx: Ctx, row: Row) -> None:
    before = await _state(ctx.stub)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await row.call(ctx)
    error = refused.value
    assert error.code() == row.code, error.details()
    assert row.says in (error.details() or ""), error.details()
    if row.field:
        [bad_request] = [d for d in status_details(error) if isinstance(d, error_details_pb2.BadRequest)]
        assert row.field in [violation.field for violation in bad_request.field_violations]
    assert await _state(ctx.stub) == before
