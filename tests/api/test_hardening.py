"""Hostile input at the edge (issue 9): one test per finding, each against a real server on
loopback, called through the generated stubs (or raw bytes where the stubs cannot go)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import stat
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import RunningServer
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.build import agent, create, http_tool, run, spawn, status_details, transcript, wait
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.probe import InspectProbe
from tests.support.process import ServerProcess
from tests.support.servers import serve
from tests.support.tool_server import ToolServer

Code = grpc.StatusCode
KEY = "sk-test-secret-never-shown"
SERVICE = "agentruntime.v1.AgentRuntime"
KIB = 1024
MIB = 1024 * KIB


# ---- helpers ----


@asynccontextmanager
async def serving(model: ScriptedModelServer, **overrides: Any) -> AsyncIterator[tuple[RunningServer, pb_grpc.AgentRuntimeStub]]:
    """A server with settings of the test's own (memory store unless `store` is given)."""
    fields: dict[str, Any] = {"llm_style": "openai", "llm_base_url": model.base_url, "llm_api_key": KEY, **overrides}
    async with serve(**fields) as served:
        yield served.running, served.stub


async def refused(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    """The BadRequest field violations: field -> description."""
    [bad_request] = [d for d in status_details(error) if isinstance(d, error_details_pb2.BadRequest)]
    return {violation.field: violation.description for violation in bad_request.field_violations}


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    [info] = [d for d in status_details(error) if isinstance(d, error_details_pb2.ErrorInfo)]
    return info


def assert_invalid(error: grpc.aio.AioRpcError, field: str, says: str) -> None:
    assert error.code() == Code.INVALID_ARGUMENT, (error.code(), error.details())
    found = violations(error)
    assert field in found, found
    assert says in found[field], found[field]
    assert says in (error.details() or ""), error.details()


async def assert_absent(stub: pb_grpc.AgentRuntimeStub, runtime_id: str) -> None:
    error = await refused(stub.List(pb.ListRequest(runtime_id=runtime_id)))
    assert error.code() == Code.NOT_FOUND, error.details()


def scripted(name: str, *replies: pb.ScriptedReply, **fields: Any) -> pb.AgentDef:
    """An agent on the embedded scripted model."""
    return agent(name, script=pb.Script(replies=list(replies)), **fields)


def call(name: str, arguments: dict[str, Any]) -> pb.ScriptedToolCall:
    return pb.ScriptedToolCall(name=name, arguments_json=json.dumps(arguments))


def tool_with_schema(name: str, url: str, schema: dict[str, Any]) -> pb.ToolDef:
    return http_tool(name, url, schema)


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not [record for record in caplog.records if record.exc_info], caplog.text
    assert "Traceback" not in caplog.text, caplog.text
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text


# ---- 1. $ref: no file read, no network fetch, no self-reference ----


OUTSIDE = {
    "file": {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}},
    "http-top": {"type": "object", "$ref": "http://127.0.0.1:9/x.json"},
    "http-property": {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x.json#/defs/a"}}},
}


@pytest.mark.parametrize("schema", OUTSIDE.values(), ids=OUTSIDE.keys())
async def test_1_a_ref_outside_the_schema_is_refused(stub: pb_grpc.AgentRuntimeStub, schema: dict[str, Any]) -> None:
    tool = tool_with_schema("lookup", "http://127.0.0.1:9/tool", schema)
    started = time.monotonic()
    error = await refused(stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="refs", agents=[agent("a", tools=[tool])])))
    assert time.monotonic() - started < 2.0
    assert_invalid(error, "agents[0].tools[0].input_schema", "points outside the schema")
    await assert_absent(stub, "refs")


async def test_1_a_schema_referring_to_itself_is_refused(stub: pb_grpc.AgentRuntimeStub) -> None:
    tool = tool_with_schema("lookup", "http://127.0.0.1:9/tool", {"type": "object", "$ref": "#"})
    error = await refused(stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="selfref", agents=[agent("a", tools=[tool])])))
    assert_invalid(error, "agents[0].tools[0].input_schema", "refers to itself")
    await assert_absent(stub, "selfref")


async def test_1_a_local_ref_is_accepted_and_validates_calls(stub: pb_grpc.AgentRuntimeStub, tools: ToolServer) -> None:
    schema = {
        "type": "object",
        "$defs": {"short": {"type": "string", "maxLength": 5}},
        "properties": {"a": {"$ref": "#/$defs/short"}},
        "required": ["a"],
    }
    caller = scripted(
        "caller",
        pb.ScriptedReply(tool_calls=[call("lookup", {"a": "ok"}), call("lookup", {"a": 12345})], tokens=10),
        pb.ScriptedReply(text="done", tokens=10),
        tools=[tool_with_schema("lookup", tools.url("lookup"), schema)],
    )
    runtime_id = await create(stub, caller)
    handle_id, result = await run(stub, runtime_id, "caller", "look it up")
    assert (result.status, result.text) == (pb.STATUS_DONE, "done"), result.text
    assert "internal error" not in result.text
    results = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    good, bad = results
    assert (good.content, good.is_error) == ("lookup ok #1", False)
    assert bad.is_error
    assert "do not match the tool's schema" in bad.content, bad.content
    assert tools.hits["lookup"] == 1  # the bad call never reached the tool


# ---- 2. catastrophic regexes run in linear time ----


async def bystander(stub: pb_grpc.AgentRuntimeStub) -> tuple[str, str]:
    runtime_id = await create(stub, scripted("idle", pb.ScriptedReply(text="idle")))
    return runtime_id, await spawn(stub, runtime_id, "idle")


async def test_2_a_catastrophic_must_match_does_not_freeze_the_server(
    server: RunningServer, stub: pb_grpc.AgentRuntimeStub
) -> None:
    answer = "a" * 100_000 + "!"
    gate = pb.CompletionGate(must_match="(a+)+$", max_attempts=3)
    # A short delay per reply: the probe samples between the gate's runs as well as across them.
    reply = pb.ScriptedReply(text=answer, tokens=5, delay=duration_pb2.Duration(nanos=50_000_000))
    runtime_id = await create(stub, scripted("greedy", reply, completion=gate))
    other = await bystander(stub)
    async with InspectProbe(f"127.0.0.1:{server.port}", *other) as probe:
        _, result = await run(stub, runtime_id, "greedy", "answer")
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_COMPLETION), result.text
    assert result.turns == 3
    assert len(probe.latencies) >= 5
    assert max(probe.latencies) < 0.1, f"an Inspect took {max(probe.latencies) * 1000:.0f} ms"


async def test_2_a_catastrophic_schema_pattern_does_not_freeze_the_server(
    server: RunningServer, stub: pb_grpc.AgentRuntimeStub, tools: ToolServer
) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}, "required": ["s"]}
    delay = duration_pb2.Duration(nanos=50_000_000)
    caller = scripted(
        "caller",
        pb.ScriptedReply(tool_calls=[call("check", {"s": "a" * 100_000 + "!"})], tokens=5, delay=delay),
        pb.ScriptedReply(text="done", tokens=5, delay=delay),
        tools=[tool_with_schema("check", tools.url("check"), schema)],
    )
    runtime_id = await create(stub, caller)
    other = await bystander(stub)
    async with InspectProbe(f"127.0.0.1:{server.port}", *other) as probe:
        handle_id, result = await run(stub, runtime_id, "caller", "check it")
    assert (result.status, result.text) == (pb.STATUS_DONE, "done"), result.text
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error
    assert "do not match the tool's schema" in tool_message.content
    assert tools.hits["check"] == 0
    assert len(probe.latencies) >= 3
    assert max(probe.latencies) < 0.1, f"an Inspect took {max(probe.latencies) * 1000:.0f} ms"


async def test_2_a_huge_or_backtracking_must_match_is_refused(stub: pb_grpc.AgentRuntimeStub) -> None:
    huge = agent("a", completion=pb.CompletionGate(must_match="a" * MIB))
    started = time.monotonic()
    error = await refused(stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="huge", agents=[huge])))
    assert time.monotonic() - started < 1.0
    assert_invalid(error, "agents[0].completion.must_match", "1024")
    assert len(error.details() or "") < 1000

    backreference = agent("a", completion=pb.CompletionGate(must_match=r"(a)\1"))
    error = await refused(stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="backref", agents=[backreference])))
    assert_invalid(error, "agents[0].completion.must_match", "RE2")
    await assert_absent(stub, "huge")
    await assert_absent(stub, "backref")


# ---- 3. a poisoned token count ----


async def test_3_a_reply_reporting_2_62_tokens_errors_and_the_runtime_survives_a_restart(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    poison = 2**62
    model.script("poison", lambda body: Reply(text="rich", tokens=poison))
    process = ServerProcess(tmp_path / "store.db", model.base_url, tmp_path / "server.log")
    try:
        stub = await process.start()
        runtime_id = await create(stub, agent("poison"))
        closed, closed_result = await run(stub, runtime_id, "poison", "spend")
        kept, kept_result = await run(stub, runtime_id, "poison", "spend again")
        for result in (closed_result, kept_result):
            assert result.status == pb.STATUS_ERROR, result
            assert str(poison) in result.text, result.text
            assert (result.own_tokens, result.total_tokens) == (0, 0)
        assert model.calls["poison"] == 2

        async def answers(stub: pb_grpc.AgentRuntimeStub) -> None:
            assert await wait(stub, runtime_id, kept) == kept_result
            assert (await wait(stub, runtime_id, closed)).status in (pb.STATUS_ERROR, pb.STATUS_CLOSED)
            listed = await stub.List(pb.ListRequest(runtime_id=runtime_id), timeout=10)
            assert [view.handle_id for view in listed.handles] == [closed, kept]
            for handle_id in (closed, kept):
                view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).handle
                assert (view.own_tokens, view.total_tokens, view.turns) == (0, 0, 0)
                assert view.state in (pb.HANDLE_STATE_IDLE, pb.HANDLE_STATE_CLOSED)
            await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=closed, force=True), timeout=10)

        await answers(stub)
        view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=kept))).handle
        assert (view.state, view.last_status) == (pb.HANDLE_STATE_IDLE, pb.STATUS_ERROR)

        await process.stop(signal.SIGKILL)
        stub = await process.restart()
        await answers(stub)
        await asyncio.sleep(0.3)  # recovery had its chance to re-run anything
        assert model.calls["poison"] == 2, "a settled handle was run again after the restart"
        view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=kept))).handle
        assert (view.state, view.last_status) == (pb.HANDLE_STATE_IDLE, pb.STATUS_ERROR)
        closed_ids = await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=kept, force=True), timeout=10)
        assert list(closed_ids.closed_handle_ids) == [kept]
    finally:
        if process.process is not None and process.process.returncode is None:
            await process.stop()
    assert "Traceback" not in process.log.read_text()


async def test_3_a_negative_token_count_errors(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("refund", lambda body: Reply(text="refund", tokens=-5))
    runtime_id = await create(stub, agent("refund"))
    handle_id, result = await run(stub, runtime_id, "refund", "spend")
    assert result.status == pb.STATUS_ERROR, result
    assert "-5" in result.text, result.text
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert (view.own_tokens, view.total_tokens) == (0, 0)


# ---- 4. delegation cycles ----


CYCLES = {
    "self": [agent("a", team=["a"])],
    "pair": [agent("a", team=["b"]), agent("b", team=["a"])],
    "judge": [agent("a", completion=pb.CompletionGate(judge_agent="b")), agent("b", team=["a"])],
}


@pytest.mark.parametrize("agents", CYCLES.values(), ids=CYCLES.keys())
async def test_4_a_delegation_cycle_is_refused(stub: pb_grpc.AgentRuntimeStub, agents: list[pb.AgentDef]) -> None:
    error = await refused(stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="cyclic", agents=agents)))
    assert error.code() == Code.INVALID_ARGUMENT, error.details()
    teams = {field: text for field, text in violations(error).items() if field in (f"agents[{i}].team" for i in range(2))}
    assert teams, violations(error)
    assert all("cycle" in text for text in teams.values()), teams
    assert "cycle" in (error.details() or "")
    await assert_absent(stub, "cyclic")


async def test_4_a_deep_acyclic_chain_runs(stub: pb_grpc.AgentRuntimeStub) -> None:
    chain = [
        agent("a", team=["b"], provider="scripted"),
        agent("b", team=["c"], provider="scripted"),
        agent("c", team=["d"], provider="scripted"),
        agent("d", provider="scripted"),
    ]
    runtime_id = await create(stub, *chain)
    _, result = await run(stub, runtime_id, "a", "go deep")
    assert result.status == pb.STATUS_DONE, result.text
    listed = await stub.List(pb.ListRequest(runtime_id=runtime_id))
    assert [view.handle_id for view in listed.handles] == [
        "root/a.1",
        "root/a.1/b.1",
        "root/a.1/b.1/c.1",
        "root/a.1/b.1/c.1/d.1",
    ]


# ---- 5. sizes and pages ----


async def test_5_a_900_kb_post_is_refused(stub: pb_grpc.AgentRuntimeStub) -> None:
    runtime_id = await create(stub, agent("worker"))
    handle_id = await spawn(stub, runtime_id, "worker")
    for n in range(5):
        error = await refused(stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text=str(n) * 900_000)))
        assert_invalid(error, "text", "262144")
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert view.inbox_size == 0


async def test_5_the_inbox_byte_limit(model: ScriptedModelServer) -> None:
    async with serving(model, max_text_bytes=MIB) as (_, stub):
        runtime_id = await create(stub, agent("worker"))
        handle_id = await spawn(stub, runtime_id, "worker")
        posted = await stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="1" * 900_000))
        assert posted.inbox_size == 1
        error = await refused(stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="2" * 900_000)))
        assert error.code() == Code.RESOURCE_EXHAUSTED, error.details()
        assert error_info(error).reason == "INBOX_FULL"
        view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
        assert view.inbox_size == 1


async def test_5_transcript_and_list_pages(model: ScriptedModelServer) -> None:
    answers = [chr(ord("A") + i) * 60_000 for i in range(4)]
    async with serving(model, max_message_bytes=256 * KIB, max_text_bytes=100_000) as (_, stub):
        talker = scripted("talker", *(pb.ScriptedReply(text=text, tokens=1) for text in answers))
        runtime_id = await create(stub, talker)
        handle_id = await spawn(stub, runtime_id, "talker")
        for wake in range(4):
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=f"wake {wake}"))
            result = await wait(stub, runtime_id, handle_id)
            assert (result.status, result.text) == (pb.STATUS_DONE, answers[wake])

        first = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
        assert first.ByteSize() < 128 * KIB
        assert first.next_page_token
        assert 0 < len(first.messages) < 8
        pages = [first]
        while pages[-1].next_page_token:
            request = pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id, page_token=pages[-1].next_page_token)
            pages.append(await stub.GetTranscript(request))
            assert pages[-1].ByteSize() < 128 * KIB
            assert len(pages) < 20
        messages = [(m.role, m.content) for page in pages for m in page.messages]
        expected = [pair for wake in range(4) for pair in (("user", f"wake {wake}"), ("assistant", answers[wake]))]
        assert messages == expected

        other = await spawn(stub, runtime_id, "talker")
        error = await refused(
            stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=other, page_token=first.next_page_token))
        )
        assert_invalid(error, "page_token", "next_page_token")

        third = await spawn(stub, runtime_id, "talker")
        listed: list[str] = []
        token = ""
        for _ in range(10):
            page = await stub.List(pb.ListRequest(runtime_id=runtime_id, page_size=1, page_token=token))
            assert len(page.handles) == 1
            listed.append(page.handles[0].handle_id)
            token = page.next_page_token
            if not token:
                break
        assert listed == [handle_id, other, third]


# ---- 6. durations and enums ----


def _http(timeout: duration_pb2.Duration) -> pb.ToolDef:
    return pb.ToolDef(name="lookup", http=pb.HttpTool(url="http://127.0.0.1:9/tool", timeout=timeout))


OUT_OF_RANGE = {
    "http timeout 2**62 s": (
        agent("a", tools=[_http(duration_pb2.Duration(seconds=2**62))]),
        "agents[0].tools[0].http.timeout",
    ),
    "max_wall_time 31 days": (
        agent("a", budget=pb.Budget(max_wall_time=duration_pb2.Duration(seconds=31 * 86400))),
        "agents[0].budget.max_wall_time",
    ),
    "delay nanos 2e9": (
        scripted("a", pb.ScriptedReply(text="x", delay=duration_pb2.Duration(nanos=2 * 10**9))),
        "agents[0].script.replies[0].delay",
    ),
    "guardrail action 999": (
        agent("a", tools=[_http(duration_pb2.Duration(seconds=1))], guardrails=[pb.Guardrail(tool="lookup", action=999)]),  # type: ignore[arg-type]
        "agents[0].guardrails[0].action",
    ),
    "on_interrupted 3": (
        agent("a", tools=[pb.ToolDef(name="lookup", relay=pb.RelayTool(), on_interrupted=3)]),  # type: ignore[arg-type]
        "agents[0].tools[0].on_interrupted",
    ),
}


@pytest.mark.parametrize(("definition", "field"), OUT_OF_RANGE.values(), ids=OUT_OF_RANGE.keys())
async def test_6_out_of_range_durations_and_enums_are_refused(
    stub: pb_grpc.AgentRuntimeStub, definition: pb.AgentDef, field: str
) -> None:
    error = await refused(stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="ranges", agents=[definition])))
    assert error.code() == Code.INVALID_ARGUMENT, error.details()
    assert field in violations(error), violations(error)
    await assert_absent(stub, "ranges")


@pytest.mark.parametrize("seconds", [2**62, 25 * 3600], ids=["2**62 s", "25 h"])
async def test_6_out_of_range_wait_timeout_is_refused(stub: pb_grpc.AgentRuntimeStub, seconds: int) -> None:
    runtime_id = await create(stub, scripted("quick", pb.ScriptedReply(text="done")))
    handle_id, _ = await run(stub, runtime_id, "quick", "go")
    request = pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id, timeout=duration_pb2.Duration(seconds=seconds))
    error = await refused(stub.Wait(request, timeout=10))
    assert error.code() == Code.INVALID_ARGUMENT, error.details()
    assert "timeout" in violations(error)


# ---- 7. undecodable requests ----


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _deep_create_runtime(levels: int) -> bytes:
    """A CreateRuntimeRequest whose one tool's input_schema nests `levels` Structs deep."""
    struct = b""
    for _ in range(levels):
        value = _field(5, struct)  # Value.struct_value
        entry = _field(1, b"a") + _field(2, value)  # map entry: key, value
        struct = _field(1, entry)  # Struct.fields
    tool = _field(1, b"lookup") + _field(3, struct) + _field(4, b"")  # name, input_schema, relay
    agent_def = _field(1, b"a") + _field(5, tool)  # name, tools
    return _field(1, b"deep") + _field(2, agent_def)  # runtime_id, agents


async def test_7_undecodable_requests_are_invalid_argument_without_a_traceback(
    server: RunningServer, stub: pb_grpc.AgentRuntimeStub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cases = {
        "Inspect": [b"\xff\xff\xff\xff\xff\xff", _field(1, b"\xff\xfe") + _field(2, b"root/a.1")],
        "CreateRuntime": [_deep_create_runtime(200)],
    }
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for method, bodies in cases.items():
            raw = channel.unary_unary(f"/{SERVICE}/{method}")
            for body in bodies:
                error = await refused(raw(body, timeout=10))
                assert error.code() == Code.INVALID_ARGUMENT, (method, body[:20], error.code(), error.details())
                assert f"is not a valid agentruntime.v1.{method}Request message" in (error.details() or "")
    await assert_absent(stub, "deep")
    no_traceback(caplog)


# ---- 8. a huge id ----


async def test_8_a_huge_runtime_id_is_invalid_argument(stub: pb_grpc.AgentRuntimeStub) -> None:
    error = await refused(stub.List(pb.ListRequest(runtime_id="r" * 10_000)))
    assert error.code() == Code.INVALID_ARGUMENT, (error.code(), (error.details() or "")[:200])
    assert len(error.details() or "") < 1000
    assert "runtime_id" in violations(error)


# ---- 9. definitions that only failed when run ----


def _headers(headers: dict[str, str]) -> pb.AgentDef:
    return agent("a", tools=[pb.ToolDef(name="lookup", http=pb.HttpTool(url="http://127.0.0.1:9/tool", headers=headers))])


HEADER_FIELD = "agents[0].tools[0].http.headers"
RUN_FAILURES = {
    "CRLF in a value": (_headers({"X-Test": "a\r\nInjected: 1"}), f"{HEADER_FIELD}['X-Test']", "CR, LF or NUL"),
    "space in a name": (_headers({"X Test": "v"}), f"{HEADER_FIELD}['X Test']", "not a header name"),
    "empty name": (_headers({"": "v"}), f"{HEADER_FIELD}['']", "not a header name"),
    "1 MB value": (_headers({"X-Big": "v" * MIB}), f"{HEADER_FIELD}['X-Big']", "8192 bytes"),
    "reserved Idempotency-Key": (
        _headers({"Idempotency-Key": "mine"}),
        f"{HEADER_FIELD}['Idempotency-Key']",
        "set by the runtime itself",
    ),
    "duration nanos out of range": (
        agent("a", tools=[_http(duration_pb2.Duration(seconds=1, nanos=10**9))]),
        "agents[0].tools[0].http.timeout",
        "not a valid Duration",
    ),
    "no executor": (agent("a", tools=[pb.ToolDef(name="lookup")]), "agents[0].tools[0].executor", "relay"),
}


@pytest.mark.parametrize(("definition", "field", "says"), RUN_FAILURES.values(), ids=RUN_FAILURES.keys())
async def test_9_definitions_that_would_fail_when_run_are_refused(
    stub: pb_grpc.AgentRuntimeStub, definition: pb.AgentDef, field: str, says: str
) -> None:
    error = await refused(stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="runfail", agents=[definition])))
    assert_invalid(error, field, says)
    assert len(error.details() or "") < 1000
    for value in ("Injected: 1", "v" * 100, "mine"):
        assert value not in (error.details() or "")  # a header value is a secret: never quoted
    await assert_absent(stub, "runfail")


# ---- 10. the handle cap ----


async def test_10_max_handles(model: ScriptedModelServer) -> None:
    async with serving(model, max_handles=3) as (_, stub):
        runtime_id = await create(stub, agent("worker"))
        spawned = [await spawn(stub, runtime_id, "worker") for _ in range(3)]
        error = await refused(spawn(stub, runtime_id, "worker"))
        assert error.code() == Code.RESOURCE_EXHAUSTED, error.details()
        assert error_info(error).metadata["limit"] == "LIMIT_MAX_CHILDREN"
        listed = await stub.List(pb.ListRequest(runtime_id=runtime_id))
        assert [view.handle_id for view in listed.handles] == spawned


# ---- 11. a declining answer with outputs ----


async def test_11_a_declining_answer_with_outputs_is_refused_and_the_request_stays_live(stub: pb_grpc.AgentRuntimeStub) -> None:
    host = scripted(
        "host",
        pb.ScriptedReply(tool_calls=[call("approve", {"what": "deploy"})], tokens=5),
        pb.ScriptedReply(text="deployed", tokens=5),
        tools=[pb.ToolDef(name="approve", relay=pb.RelayTool())],
    )
    runtime_id = await create(stub, host)
    handle_id, pending = await run(stub, runtime_id, "host", "deploy")
    assert (pending.status, pending.pending.kind) == (pb.STATUS_PENDING, "tool_call")
    [approve] = pending.pending.calls
    declined = pb.Answer(id=pending.pending.id, ok=False, outputs=[pb.ToolOutput(call_id=approve.id, output="no")])
    error = await refused(stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=declined)))
    assert_invalid(error, "answer.outputs", "ok")
    assert await wait(stub, runtime_id, handle_id) == pending
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
    assert (view.state, view.pending_kind) == (pb.HANDLE_STATE_SUSPENDED, "tool_call")

    answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=approve.id, output="yes")])
    done = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
    assert (done.status, done.text) == (pb.STATUS_DONE, "deployed")


# ---- 12. the health service's List ----


async def test_12_health_list_answers(server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.List(health_pb2.HealthListRequest(), timeout=10)
    serving_status = health_pb2.HealthCheckResponse.SERVING
    assert reply.statuses[""].status == serving_status
    assert reply.statuses[SERVICE].status == serving_status
    no_traceback(caplog)


# ---- 13. secrets at rest ----


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_13_the_store_is_private_and_header_values_never_come_back(
    tmp_path: Path, model: ScriptedModelServer, tools: ToolServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "s3cr3t-token-value"
    store = tmp_path / "new" / "dir" / "store.db"
    async with serving(model, store=f"sqlite:///{store}") as (_, stub):
        lookup = pb.ToolDef(
            name="lookup",
            description="the lookup tool",
            http=pb.HttpTool(url=tools.url("lookup"), headers={"Authorization": f"Bearer {secret}"}),
        )
        caller = scripted(
            "caller",
            pb.ScriptedReply(tool_calls=[call("lookup", {"q": "x"})], tokens=5),
            pb.ScriptedReply(text="looked it up", tokens=5),
            tools=[lookup],
        )
        runtime_id = await create(stub, caller)
        handle_id, result = await run(stub, runtime_id, "caller", "look")
        assert (result.status, result.text) == (pb.STATUS_DONE, "looked it up")
        assert tools.hits["lookup"] == 1

        seen: list[Any] = [result]
        seen.append(await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id)))
        seen.append(await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id)))
        seen.append(await stub.List(pb.ListRequest(runtime_id=runtime_id)))
        seen.append(await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id)))

        async def watch() -> None:
            async for response in stub.Watch(pb.WatchRequest(runtime_id=runtime_id)):
                seen.append(response)
                if response.event.WhichOneof("payload") == "result":
                    return

        await asyncio.wait_for(watch(), 10)
        assert any(isinstance(item, pb.WatchResponse) for item in seen)
        for item in seen:
            assert secret.encode() not in item.SerializeToString(), item
            assert secret not in str(item)

        assert _mode(tmp_path / "new") == 0o700
        assert _mode(tmp_path / "new" / "dir") == 0o700
        assert _mode(store) == 0o600
        for suffix in ("-wal", "-shm"):
            companion = store.with_name(store.name + suffix)
            assert companion.exists(), companion
            assert _mode(companion) == 0o600, (companion, oct(_mode(companion)))
    assert secret not in caplog.text


# ---- 14. lone surrogates from a provider ----


async def test_14_a_lone_surrogate_in_a_model_reply_is_stored_as_valid_utf8(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    raw = json.dumps(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "odd",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "bad PLACEHOLDER text"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).replace("PLACEHOLDER", "\\ud800")
    assert "\\ud800" in raw
    model.script("odd", lambda body: Reply(raw=raw))
    runtime_id = await create(stub, agent("odd"))
    handle_id, result = await run(stub, runtime_id, "odd", "say something odd")
    assert result.status == pb.STATUS_DONE, result.text
    assert result.text in ("bad ? text", "bad \ufffd text"), result.text
    [reply] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "assistant"]
    assert reply.content == result.text
