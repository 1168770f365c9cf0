"""Issue 41, High 1: a tenant's schema, applied to a value a model or a third party sends, never
holds the event loop. The red team's cases (an output schema's `uniqueItems` over 4,000 items
that do not sort, an `enum` of 9,000 numbers, the same through a relay tool's input schema and a
third-party MCP server's output schema) and a schema no validator checks in bounded time (an
`anyOf` that recurses two ways: 2^16 paths): while they are checked, the server's event loop is
never held for more than 100 ms (of its thread's CPU time, which a loaded machine does not
stretch; before the change: 3.5 to 10.6 s), another tenant's ListRuntimes and health checks,
called from a thread of their own, are answered (within 1 s each, a wide margin: an idle machine
answers them within a few ms), and a check that spends its time budget refuses the value, as one
that does not match. Real server with token auth, two tenants."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support import build
from tests.support.huge_mcp import HugeMcp
from tests.support.loop_held import loop_held
from tests.support.mcp import call_then_answer
from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.servers import Served
from tests.support.tenants import ACME, GLOBEX, Caller, bearer, reply, scripted, tenant_server

# The longest the event loop may be held while a hostile check runs (the issue's bound), and
# the longest another tenant may wait for an answer meanwhile, on a machine however loaded.
HELD = 0.1
WAITED = 1.0
CHECK_SECONDS = 1.0

UNIQUE: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
RED_TEAM_ITEMS: list[Any] = [{}, *range(4000)]  # items that do not sort: jsonschema compares them pairwise
NUMBERS: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": list(range(9000))}}}}
# Two ways back into itself at every level: a validator explores 2^depth paths to refuse a leaf.
TWO_WAYS: dict[str, Any] = {
    "type": "object",
    "properties": {"t": {"$ref": "#/$defs/n"}},
    "$defs": {
        "n": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/n"}, {"$ref": "#/$defs/m"}, {"type": "string"}]}},
        "m": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/m"}, {"$ref": "#/$defs/n"}, {"type": "string"}]}},
    },
}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def typed(name: str, schema: dict[str, Any], *answers: str, attempts: int = 0) -> pb.AgentDef:
    definition = scripted(name, *(reply(answer) for answer in answers))
    definition.output_schema.update(schema)
    if attempts:
        definition.completion.max_attempts = attempts
    return definition


@pytest.fixture
async def served(tmp_path: Path, model: ScriptedModelServer) -> AsyncIterator[Served]:
    # The MCP server is on loopback, which a server with authentication closes to tools unless told.
    async with tenant_server(
        tmp_path,
        schema_check_seconds=CHECK_SECONDS,
        tool_egress_allow=["127.0.0.1/32"],
        llm_style="openai",
        llm_base_url=model.base_url,
        llm_api_key="sk-test",
    ) as served:
        yield served


async def while_checked(served: Served, work: Awaitable[Any]) -> Any:
    """`work`'s outcome, once it is known that meanwhile the loop was held for less than HELD,
    and that another tenant (globex), calling ListRuntimes and the health check one after the
    other every 10 ms from a thread of its own, waited less than WAITED for each."""
    stop = threading.Event()
    ready = threading.Event()
    waits: list[float] = []

    def probe() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = pb_grpc.AgentRuntimeStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            metadata = bearer(GLOBEX[1])
            stub.ListRuntimes(pb.ListRuntimesRequest(page_size=10), metadata=metadata, timeout=30)  # connected
            ready.set()
            while not stop.is_set():
                for call in (
                    lambda: stub.ListRuntimes(pb.ListRuntimesRequest(page_size=10), metadata=metadata, timeout=30),
                    lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=30),
                ):
                    started = time.monotonic()
                    call()
                    waits.append(time.monotonic() - started)
                stop.wait(0.01)

    prober = asyncio.ensure_future(asyncio.to_thread(probe))
    await until(ready.is_set, "the other tenant's first call", timeout=30)
    try:
        async with loop_held() as held:
            outcome = await work
    finally:
        stop.set()
        await prober
    assert held.longest < HELD, f"the event loop was held for {held.longest * 1000:.0f} ms of CPU time"
    assert waits and max(waits) < WAITED, f"another tenant waited {max(waits, default=0) * 1000:.0f} ms"
    return outcome


async def created(acme: Caller, *agents: pb.AgentDef) -> str:
    response = await acme("CreateRuntime", pb.CreateRuntimeRequest(agents=list(agents)))
    return str(response.runtime_id)


def output_of(result: pb.TaskResult) -> Any:
    return json_format.MessageToDict(result.output) if result.HasField("output") else None


async def test_a_typed_answer_with_4000_unsortable_unique_items_is_judged_off_the_loop(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    answer = json.dumps({"a": RED_TEAM_ITEMS})  # 23 KB
    duplicated = json.dumps({"a": [*RED_TEAM_ITEMS, 17]})
    runtime_id = await created(acme, typed("sorter", UNIQUE, duplicated, answer))
    handle_id, result = await while_checked(served, acme.run(runtime_id, "sorter", "sort"))
    assert (result.status, result.turns) == (pb.STATUS_DONE, 2)
    assert output_of(result) == {"a": RED_TEAM_ITEMS}
    transcript = await acme("GetTranscript", pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    feedback = transcript.messages[-2]
    assert feedback.role == "user" and "has non-unique elements" in feedback.content


async def test_a_typed_answer_checked_against_an_enum_of_9000_numbers_is_judged_off_the_loop(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    members = list(range(8999, 4999, -1))
    runtime_id = await created(acme, typed("picker", NUMBERS, json.dumps({"a": [*members, 9000]}), json.dumps({"a": members})))
    _, result = await while_checked(served, acme.run(runtime_id, "picker", "pick"))
    assert (result.status, result.turns, output_of(result)) == (pb.STATUS_DONE, 2, {"a": members})


async def test_relay_arguments_checked_against_unique_items_are_judged_off_the_loop(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    lookup = pb.ToolDef(name="lookup", description="the host looks it up", relay=pb.RelayTool())
    lookup.input_schema.update(UNIQUE)
    arguments = json.dumps({"a": RED_TEAM_ITEMS})
    asker = scripted("asker", reply(calls=(("lookup", arguments),)), reply("answered"), tools=(lookup,))
    runtime_id = await created(acme, asker)
    _, result = await while_checked(served, acme.run(runtime_id, "asker", "look it up"))
    assert result.status == pb.STATUS_PENDING  # the arguments match: the host is asked
    assert [call.arguments_json for call in result.pending.calls] == [arguments]


async def test_an_mcp_servers_structured_content_is_judged_off_the_loop(served: Served, model: ScriptedModelServer) -> None:
    acme = Caller(served.stub, ACME)
    mcp = HugeMcp(output_schema=UNIQUE, structured={"a": RED_TEAM_ITEMS})
    await mcp.start()
    try:
        model.script("caller", call_then_answer("huge__big0_0", {}))
        agent = build.agent("caller", mcp_servers=[pb.McpServer(name="huge", url=mcp.url)])
        runtime_id = await created(acme, agent)
        handle_id, result = await while_checked(served, acme.run(runtime_id, "caller", "call it"))
    finally:
        await mcp.stop()
    assert result.status == pb.STATUS_DONE
    transcript = await acme("GetTranscript", pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    [tool] = [message for message in transcript.messages if message.role == "tool"]
    assert (tool.is_error, json.loads(tool.content)) == (False, {"a": RED_TEAM_ITEMS})


async def test_a_check_that_spends_its_time_budget_refuses_the_answer_and_holds_nothing(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    runtime_id = await created(acme, typed("deep", TWO_WAYS, json.dumps({"t": nested(16)}), attempts=1))
    started = time.monotonic()
    _, result = await while_checked(served, acme.run(runtime_id, "deep", "answer"))
    assert time.monotonic() - started >= CHECK_SECONDS  # it was given its budget
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_COMPLETION)
    assert f"checking it took longer than the limit of {CHECK_SECONDS:g} s" in result.text
    # The checker that was stopped is replaced: the next check is judged as usual.
    runtime_id = await created(acme, typed("shallow", TWO_WAYS, json.dumps({"t": nested(3)}), json.dumps({"t": [["x"]]})))
    _, result = await acme.run(runtime_id, "shallow", "answer")
    assert (result.status, result.turns, output_of(result)) == (pb.STATUS_DONE, 2, {"t": [["x"]]})
