"""Model providers over a real server: Anthropic's messages API end to end, named providers
chosen per agent, and provider faults (429 with Retry-After, 5xx, timeouts, dropped
connections, malformed replies) retried or settled ERROR, never a hang; odd replies and tool
answers (fields of the wrong type, Retry-After values that are no time, a filtered reply with
calls, usage without figures, a key across the error excerpt's cut, a redirect, a pending
Request a Struct cannot carry). Backoffs are tiny here so that every test stays well under
the time its faults would take for real."""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.definitions.validation import check_agents
from agentruntime_server.domain.errors import InvalidArgument
from agentruntime_server.domain.ports import ModelRequest, ProviderError
from agentruntime_server.domain.vocabulary import AgentSpec, Message
from agentruntime_server.providers.base import retry_after
from agentruntime_server.providers.router import ProviderRouter
from agentruntime_server.providers.scripted import ScriptedProvider
from agentruntime_server.settings import ProviderSettings, Settings
from aiohttp import web
from multidict import CIMultiDict
from pydantic import SecretStr, ValidationError

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.anthropic_server import tool_results as anthropic_results
from tests.support.build import agent, create, http_tool, run, spawn, status_details
from tests.support.loopback import Loopback
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.servers import serve
from tests.support.tool_server import ToolServer

OPENAI_KEY = "sk-test-secret-never-shown"
ANTHROPIC_KEY = "sk-ant-test-secret-never-shown"
MAX_RETRIES = 2  # three attempts in all
BACKOFF_MAX = 0.5


@asynccontextmanager
async def serving(**overrides: Any) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    async with serve(**overrides) as served:
        yield served.stub


def fast_settings(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer, **overrides: Any) -> dict[str, Any]:
    """The default provider is `openai` (the OpenAI-compatible mock), as in conftest."""
    settings: dict[str, Any] = {
        "llm_style": "openai",
        "llm_base_url": model.base_url,
        "llm_api_key": OPENAI_KEY,
        "llm_max_retries": MAX_RETRIES,
        "llm_backoff_base": 0.01,
        "llm_backoff_max": BACKOFF_MAX,
        "providers": {
            "anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": ANTHROPIC_KEY, "model": "claude-test"},
            "local": {"style": "openai", "base_url": model.base_url},
            "impatient": {"style": "openai", "base_url": model.base_url, "timeout": 0.3},
        },
    }
    settings.update(overrides)
    return settings


@pytest.fixture
async def stub(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    """Overrides conftest's stub: the same server, with named providers and fast retries."""
    async with serving(**fast_settings(model, anthropic)) as stub:
        yield stub


def timed(replies: list[Reply], then: Reply, times: list[float]) -> Any:
    """A script that answers `replies` in turn, then `then` for ever, noting when each call came."""

    def script(body: dict[str, Any]) -> Reply:
        times.append(time.monotonic())
        return replies[len(times) - 1] if len(times) <= len(replies) else then

    return script


async def still_serves(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, runtime_id: str = "") -> None:
    model.script("healthy", lambda body: Reply(text="fine", tokens=3))
    runtime_id = await create(stub, agent("healthy"))
    _, result = await run(stub, runtime_id, "healthy", "are you there?")
    assert (result.status, result.text) == (pb.STATUS_DONE, "fine")


# ---- anthropic ---------------------------------------------------------------------------


async def test_anthropic_end_to_end(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer, tools: ToolServer
) -> None:
    def lead(body: dict[str, Any]) -> Turn:
        if not anthropic_results(body):
            calls: list[tuple[str, dict[str, Any]]] = [("ping", {"n": 1}), ("task", {"agent": "worker", "prompt": "dig"})]
            return Turn(text="Let me check.", calls=calls, input_tokens=100, output_tokens=20)
        return Turn(text="all done", input_tokens=150, output_tokens=30)

    anthropic.script("claude-test", lead)
    model.script("worker", lambda body: Reply(text="dug", tokens=40))
    coordinator = agent(
        "lead",
        model="claude-test",
        provider="anthropic",
        instructions="You coordinate.",
        tools=[http_tool("ping", tools.url("ping"), {"type": "object", "properties": {"n": {"type": "integer"}}})],
        team=["worker"],
    )
    runtime_id = await create(stub, coordinator, agent("worker"))

    handle_id, result = await run(stub, runtime_id, "lead", "Map the repo.")

    assert (result.status, result.text) == (pb.STATUS_DONE, "all done")
    assert (result.turns, result.tool_calls) == (2, 2)
    assert result.own_tokens == 100 + 20 + 150 + 30
    assert result.total_tokens == result.own_tokens + 40  # the worker ran on the default provider
    assert anthropic.calls["claude-test"] == 2 and model.calls["worker"] == 1

    first, second = anthropic.requests
    assert first["system"] == "You coordinate."
    assert first["model"] == "claude-test" and first["max_tokens"] > 0
    assert [m["role"] for m in first["messages"]] == ["user"]
    assert first["messages"][0]["content"] == [{"type": "text", "text": "Map the repo."}]
    tools_sent = {tool["name"]: tool for tool in first["tools"]}
    assert sorted(tools_sent) == ["ask", "ping", "task"]
    assert tools_sent["ping"]["input_schema"]["properties"] == {"n": {"type": "integer"}}
    headers = anthropic.headers[0]
    assert headers["x-api-key"] == ANTHROPIC_KEY and headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in headers

    # Turn 2 replays the transcript: the assistant's tool_use blocks, then one user turn
    # carrying a tool_result for each, keyed by the same ids.
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert all(m["role"] != "system" for m in second["messages"]) and second["system"] == "You coordinate."
    text, *uses = second["messages"][1]["content"]
    assert text == {"type": "text", "text": "Let me check."}
    assert [(u["type"], u["name"], u["input"]) for u in uses] == [
        ("tool_use", "ping", {"n": 1}),
        ("tool_use", "task", {"agent": "worker", "prompt": "dig"}),
    ]
    results = second["messages"][2]["content"]
    assert [r["tool_use_id"] for r in results] == [u["id"] for u in uses]
    assert results[0]["content"] == "ping ok #1" and "dug" in results[1]["content"]
    assert not any(r.get("is_error") for r in results)
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert [m.role for m in transcript.messages] == ["user", "assistant", "tool", "tool", "assistant"]


async def test_anthropic_error_names_the_status_never_the_key(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
) -> None:
    body = json.dumps({"type": "error", "error": {"type": "authentication_error", "message": f"bad key {ANTHROPIC_KEY}"}})
    anthropic.script("claude-test", lambda body_: Turn(status=401, raw=body))
    runtime_id = await create(stub, agent("lead", model="claude-test", provider="anthropic"))
    _, result = await run(stub, runtime_id, "lead", "go")
    assert result.status == pb.STATUS_ERROR and result.is_error
    assert "'anthropic'" in result.text and "HTTP 401" in result.text and "authentication_error" in result.text
    assert ANTHROPIC_KEY not in result.text
    assert anthropic.calls["claude-test"] == 1  # a 401 is not retried
    await still_serves(stub, model)


async def test_anthropic_overloaded_is_retried(stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer) -> None:
    replies = iter([Turn(status=529, raw='{"type": "error", "error": {"type": "overloaded_error"}}')])
    anthropic.script("claude-test", lambda body: next(replies, Turn(text="calm again", input_tokens=4, output_tokens=2)))
    runtime_id = await create(stub, pb.AgentDef(name="lead", provider="anthropic"))  # no model: the provider's
    _, result = await run(stub, runtime_id, "lead", "go")
    assert (result.status, result.text, result.own_tokens) == (pb.STATUS_DONE, "calm again", 6)
    assert anthropic.calls["claude-test"] == 2


# ---- choosing a provider -----------------------------------------------------------------


async def test_each_agent_runs_on_its_provider_with_its_model_verbatim(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
) -> None:
    routed = "meta-llama/llama-3.1-8b-instruct:free"
    model.script(routed, lambda body: Reply(text="local answer"))
    model.script("plain", lambda body: Reply(text="default answer"))
    scripted = pb.Script(replies=[pb.ScriptedReply(text="offline answer", tokens=7)])
    runtime_id = await create(
        stub,
        agent("routed", model=routed, provider="local"),
        agent("plain"),
        agent("canned", provider="anthropic", script=scripted),  # a script wins over any provider
        agent("generic", provider="scripted"),
    )
    assert (await run(stub, runtime_id, "routed", "go"))[1].text == "local answer"
    assert (await run(stub, runtime_id, "plain", "go"))[1].text == "default answer"
    assert (await run(stub, runtime_id, "canned", "go"))[1].text == "offline answer"
    assert (await run(stub, runtime_id, "generic", "go"))[1].text == "generic on 'go': done."
    assert [body["model"] for body in model.requests] == [routed, "plain"]
    assert "Authorization" not in model.headers[0]  # `local` has no key
    assert model.headers[1]["Authorization"] == "Bearer " + OPENAI_KEY
    assert not anthropic.requests


async def test_an_unknown_provider_is_refused_at_create_runtime(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, agent("fine", provider="local"), agent("typo", provider="antropic"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [bad_request] = status_details(refused.value)
    [violation] = bad_request.field_violations
    assert violation.field == "agents[1].provider"
    for name in ("anthropic", "impatient", "local", "openai", "scripted"):
        assert repr(name) in violation.description


def test_check_agents_knows_the_providers() -> None:
    known = {"openai", "anthropic", "scripted"}
    check_agents([AgentSpec("a", provider="anthropic"), AgentSpec("b")], providers=known)
    check_agents([AgentSpec("a", provider="nope")])  # no names given: not checked
    with pytest.raises(InvalidArgument) as refused:
        check_agents([AgentSpec("a"), AgentSpec("b", provider="nope")], providers=known)
    [violation] = refused.value.violations
    assert violation.field == "agents[1].provider"
    assert "'nope'" in violation.description and "['anthropic', 'openai', 'scripted']" in violation.description


async def test_a_stored_agent_naming_a_vanished_provider_settles_error() -> None:
    router = ProviderRouter({"scripted": ScriptedProvider()}, "scripted", ScriptedProvider())
    request = ModelRequest(agent=AgentSpec("old", provider="gone"), messages=(Message("user", "hi"),), tools=())
    with pytest.raises(ProviderError, match="'gone' is not configured"):
        await router.complete(request)


def test_named_providers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUNTIME_LLM_STYLE", "openai")
    monkeypatch.setenv("AGENTRUNTIME_LLM_API_KEY", OPENAI_KEY)
    monkeypatch.setenv(
        "AGENTRUNTIME_PROVIDERS",
        json.dumps(
            {
                "anthropic": {"style": "anthropic", "api_key": ANTHROPIC_KEY, "timeout": 60},
                "local": {"style": "openai", "base_url": "http://127.0.0.1:8000/v1"},
            }
        ),
    )
    monkeypatch.setenv("AGENTRUNTIME_DEFAULT_PROVIDER", "anthropic")
    settings = Settings()
    table = settings.provider_table()
    assert sorted(table) == ["anthropic", "local", "openai", "scripted"]
    assert settings.default_name == "anthropic"
    assert table["anthropic"].url == "https://api.anthropic.com/v1" and table["anthropic"].timeout == 60
    assert table["openai"].url == "https://api.openai.com/v1" and table["openai"].default_model == "gpt-4o-mini"
    assert table["local"].api_key.get_secret_value() == ""
    assert ANTHROPIC_KEY not in repr(settings) and OPENAI_KEY not in repr(settings)

    monkeypatch.setenv("AGENTRUNTIME_DEFAULT_PROVIDER", "nowhere")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "'nowhere' is not a provider" in str(refused.value) and ANTHROPIC_KEY not in str(refused.value)
    monkeypatch.delenv("AGENTRUNTIME_DEFAULT_PROVIDER")
    with pytest.raises(ValidationError, match="LLM_\\* already define"):
        Settings(providers={"openai": ProviderSettings(api_key=SecretStr(ANTHROPIC_KEY))})


def test_a_key_with_a_line_break_is_refused_at_start_without_being_shown() -> None:
    """A key goes in a header, which cannot carry a line break (a key file's last newline)."""
    for settings in ({"llm_api_key": f"{OPENAI_KEY}\n"}, {"providers": {"other": {"api_key": f"{ANTHROPIC_KEY}\r\n"}}}):
        with pytest.raises(ValidationError) as refused:
            Settings(metrics_listen="off", **settings)
        assert "the key holds a line break or a NUL" in str(refused.value)
        assert OPENAI_KEY not in str(refused.value) and ANTHROPIC_KEY not in str(refused.value)


def test_retry_after_reads_seconds_dates_and_milliseconds() -> None:
    assert retry_after(CIMultiDict({"Retry-After": "7"})) == 7
    assert retry_after(CIMultiDict({"retry-after": "0.25"})) == 0.25
    assert retry_after(CIMultiDict({"retry-after-ms": "1500", "Retry-After": "9"})) == 1.5
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 < (retry_after(CIMultiDict({"Retry-After": in_a_minute})) or 0) <= 60
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    assert retry_after(CIMultiDict({"Retry-After": past})) == 0
    assert retry_after(CIMultiDict({"Retry-After": "soon"})) is None
    assert retry_after(CIMultiDict()) is None


# ---- faults ------------------------------------------------------------------------------


async def test_a_429_burst_honours_retry_after(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    busy = Reply(status=429, raw='{"error": {"message": "slow down"}}', headers={"Retry-After": "0.3"})
    times: list[float] = []
    model.script("eager", timed([busy, busy], Reply(text="finally", tokens=5), times))
    runtime_id = await create(stub, agent("eager"))
    _, result = await run(stub, runtime_id, "eager", "go")
    assert (result.status, result.text, result.own_tokens) == (pb.STATUS_DONE, "finally", 5)
    assert model.calls["eager"] == 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # The backoff alone would be about 0.01 s: the waits are the server's 0.3 s.
    assert all(0.28 <= gap < 0.3 + 0.4 for gap in gaps), gaps
    await still_serves(stub, model)


async def test_retry_after_is_capped_by_the_max_backoff(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    in_an_hour = email.utils.formatdate(time.time() + 3600, usegmt=True)
    replies = [
        Reply(status=429, raw="{}", headers={"Retry-After": "3600"}),
        Reply(status=503, raw="{}", headers={"Retry-After": in_an_hour}),
    ]
    times: list[float] = []
    model.script("eager", timed(replies, Reply(text="ok"), times))
    runtime_id = await create(stub, agent("eager"))
    _, result = await run(stub, runtime_id, "eager", "go")
    assert result.status == pb.STATUS_DONE
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(BACKOFF_MAX - 0.05 <= gap < BACKOFF_MAX + 0.4 for gap in gaps), gaps


async def test_5xx_then_success_is_retried(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    replies = [Reply(status=500, raw='{"error": "boom"}'), Reply(status=502, raw="<html>bad gateway</html>")]
    model.script("shaky", timed(replies, Reply(text="recovered", tokens=9), []))
    runtime_id = await create(stub, agent("shaky"))
    _, result = await run(stub, runtime_id, "shaky", "go")
    assert (result.status, result.text, result.turns, result.own_tokens) == (pb.STATUS_DONE, "recovered", 1, 9)
    assert model.calls["shaky"] == 3


async def test_5xx_forever_settles_error_after_max_retries(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("down", lambda body: Reply(status=500, raw=f'{{"error": "down, key {OPENAI_KEY}"}}'))
    runtime_id = await create(stub, agent("down"))
    started = time.monotonic()
    _, result = await run(stub, runtime_id, "down", "go")
    assert time.monotonic() - started < 2.5
    assert result.status == pb.STATUS_ERROR and result.is_error
    assert "'openai' answered HTTP 500" in result.text and f"after {MAX_RETRIES + 1} attempts" in result.text
    assert OPENAI_KEY not in result.text
    assert (result.turns, result.own_tokens) == (0, 0)
    assert model.calls["down"] == MAX_RETRIES + 1
    await still_serves(stub, model)


async def test_a_4xx_is_not_retried(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    model.script("picky", lambda body: Reply(status=400, raw='{"error": {"message": "bad tool schema"}}'))
    runtime_id = await create(stub, agent("picky"))
    _, result = await run(stub, runtime_id, "picky", "go")
    assert result.status == pb.STATUS_ERROR and "HTTP 400" in result.text and "bad tool schema" in result.text
    assert model.calls["picky"] == 1


async def test_a_reply_that_never_comes_times_out_each_attempt(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("mute", lambda body: Reply(text="too late", delay=30))
    runtime_id = await create(stub, agent("mute", provider="impatient"))  # 0.3 s a call
    started = time.monotonic()
    _, result = await run(stub, runtime_id, "mute", "go")
    elapsed = time.monotonic() - started
    assert result.status == pb.STATUS_ERROR
    assert "'impatient' did not answer within 0.3s" in result.text and f"after {MAX_RETRIES + 1} attempts" in result.text
    assert model.calls["mute"] == MAX_RETRIES + 1
    assert 0.9 <= elapsed < 2.5, elapsed
    await still_serves(stub, model)


@pytest.mark.parametrize(
    ("raw", "why"),
    [("this is not json", "JSONDecodeError"), ('{"choices": []}', "IndexError"), ('{"choices": [{"message": 7}]}', "")],
)
async def test_a_malformed_reply_settles_error_without_retrying(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, raw: str, why: str
) -> None:
    model.script("garbled", lambda body: Reply(raw=raw))
    runtime_id = await create(stub, agent("garbled"))
    _, result = await run(stub, runtime_id, "garbled", "go")
    assert result.status == pb.STATUS_ERROR and result.is_error
    assert "'openai' answered HTTP 200 with a reply that is not a chat completion" in result.text
    assert why in result.text
    assert model.calls["garbled"] == 1
    await still_serves(stub, model)


async def test_a_malformed_anthropic_reply_settles_error(
    stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer
) -> None:
    anthropic.script("claude-test", lambda body: Turn(raw='{"type": "message", "content": "not blocks"}'))
    runtime_id = await create(stub, agent("lead", model="claude-test", provider="anthropic"))
    _, result = await run(stub, runtime_id, "lead", "go")
    assert result.status == pb.STATUS_ERROR
    assert "'anthropic' answered HTTP 200 with a reply that is not a message" in result.text


async def test_a_dropped_connection_is_retried(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    model.script("flaky", timed([Reply(drop=True)], Reply(text="reconnected", tokens=4), []))
    runtime_id = await create(stub, agent("flaky"))
    _, result = await run(stub, runtime_id, "flaky", "go")
    assert (result.status, result.text) == (pb.STATUS_DONE, "reconnected")
    assert model.calls["flaky"] == 2
    await still_serves(stub, model)


async def test_a_dropped_connection_every_time_settles_error(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("gone", lambda body: Reply(drop=True))
    runtime_id = await create(stub, agent("gone"))
    _, result = await run(stub, runtime_id, "gone", "go")
    assert result.status == pb.STATUS_ERROR and "'openai' unreachable" in result.text
    assert model.calls["gone"] == MAX_RETRIES + 1
    await still_serves(stub, model)


# ---- the gate on calls in flight -----------------------------------------------------------


def fan_out(workers: int) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "worker", "prompt": f"job {i}"}) for i in range(workers)])
        return Reply(text="merged")

    return script


async def test_max_concurrent_model_calls_bounds_calls_in_flight(
    model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
) -> None:
    model.script("fan", fan_out(6))
    model.script("worker", lambda body: Reply(text="w", tokens=1, delay=0.15))
    async with serving(**fast_settings(model, anthropic, max_concurrent_model_calls=2)) as stub:
        runtime_id = await create(stub, agent("fan", team=["worker"]), agent("worker"))
        _, result = await run(stub, runtime_id, "fan", "go")
    assert (result.status, result.total_tokens) == (pb.STATUS_DONE, 10 + 6 + 10)
    assert model.calls["worker"] == 6
    assert model.peak_in_flight == 2


async def test_the_gate_is_not_held_during_a_backoff(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> None:
    busy = Reply(status=429, raw="{}", headers={"Retry-After": "0.4"})
    model.script("patient", timed([busy], Reply(text="patient done"), []))
    model.script("quick", lambda body: Reply(text="quick done"))
    async with serving(**fast_settings(model, anthropic, max_concurrent_model_calls=1)) as stub:
        runtime_id = await create(stub, agent("patient"), agent("quick"))

        async def quick_during_the_backoff() -> pb.TaskResult:
            await until(lambda: model.calls["patient"] == 1, "the first attempt")
            return (await run(stub, runtime_id, "quick", "go"))[1]

        (_, patient), quick = await asyncio.gather(run(stub, runtime_id, "patient", "go"), quick_during_the_backoff())
    assert (patient.status, quick.status) == (pb.STATUS_DONE, pb.STATUS_DONE)
    assert [body["model"] for body in model.requests] == ["patient", "quick", "patient"]


# ---- odd replies and answers ------------------------------------------------------------------------


@pytest.fixture
async def both(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    """OpenAI-style by default, and an `anthropic` provider."""
    async with serve(
        llm_style="openai",
        llm_base_url=model.base_url,
        llm_api_key=OPENAI_KEY,
        llm_max_retries=2,
        llm_backoff_base=0.01,
        llm_backoff_max=0.5,
        providers={
            "anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": ANTHROPIC_KEY, "model": "claude"}
        },
    ) as served:
        yield served.stub


def completion(message: dict[str, Any], finish: str = "stop", usage: Any = None) -> str:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage if usage is not None else {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        }
    )


def anthropic_message(content: list[dict[str, Any]], usage: Any = "default") -> str:
    payload: dict[str, Any] = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": "c",
        "content": content,
        "stop_reason": "end_turn",
    }
    if usage is not None:
        payload["usage"] = {"input_tokens": 10, "output_tokens": 5} if usage == "default" else usage
    return json.dumps(payload)


def first_then(raw: Reply | Turn, then: Reply | Turn) -> Any:
    replies = [raw]
    return lambda body: replies.pop() if replies else then


# ---- a field of the wrong type is the provider's bad reply, not the runtime's error ----

OPENAI_WRONG_TYPES = {
    "a null function name": {"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": None}}]},
    "a numeric function name": {"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": 7}}]},
    "numeric content": {"content": 42},
}


@pytest.mark.parametrize("message", OPENAI_WRONG_TYPES.values(), ids=OPENAI_WRONG_TYPES.keys())
async def test_an_openai_reply_field_of_the_wrong_type_is_a_bad_reply(
    both: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, message: dict[str, Any]
) -> None:
    model.script("odd", lambda body: Reply(raw=completion({"role": "assistant", **message}, "tool_calls")))
    _, result = await run(both, await create(both, agent("odd")), "odd", "go")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_PROVIDER_BAD_REPLY), result


async def test_openai_content_as_text_parts_is_read(both: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    parts = [{"type": "text", "text": "hel"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "lo"}]
    model.script("parts", lambda body: Reply(raw=completion({"role": "assistant", "content": parts})))
    _, result = await run(both, await create(both, agent("parts")), "parts", "go")
    assert (result.status, result.text, result.total_tokens) == (pb.STATUS_DONE, "hello", 10), result


ANTHROPIC_WRONG_TYPES = {
    "a numeric tool name": [{"type": "tool_use", "id": "t1", "name": 5, "input": {}}],
    "a numeric signature": [{"type": "thinking", "thinking": "hm", "signature": 5}, {"type": "text", "text": "ok"}],
    "null thinking": [{"type": "thinking", "thinking": None, "signature": "s"}, {"type": "text", "text": "ok"}],
    "numeric redacted data": [{"type": "redacted_thinking", "data": 7}, {"type": "text", "text": "ok"}],
}


@pytest.mark.parametrize("content", ANTHROPIC_WRONG_TYPES.values(), ids=ANTHROPIC_WRONG_TYPES.keys())
async def test_an_anthropic_block_of_the_wrong_type_is_a_bad_reply(
    both: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer, content: list[dict[str, Any]]
) -> None:
    anthropic.script("claude", lambda body: Turn(raw=anthropic_message(content)))
    runtime_id = await create(both, agent("a", model="claude", provider="anthropic"))
    _, result = await run(both, runtime_id, "a", "go")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_PROVIDER_BAD_REPLY), result


# A token count is a whole number: a string, a boolean or a fraction is the provider's fault, never
# read as a number ("100" as 100, true as 1, 1.9 cut to 1). 100.0 is the number 100.
OPENAI_ODD_USAGE = {
    "a string": {"prompt_tokens": "100", "completion_tokens": 5, "total_tokens": 105},
    "true": {"prompt_tokens": 5, "completion_tokens": True, "total_tokens": 6},
    "a fraction": {"prompt_tokens": 1.9, "completion_tokens": 5, "total_tokens": 6.9},
    "a string total": {"total_tokens": "105"},
    "a fractional cached count": {
        "prompt_tokens": 5,
        "completion_tokens": 5,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 0.5},
    },
    "a string reasoning count": {
        "prompt_tokens": 5,
        "completion_tokens": 5,
        "total_tokens": 10,
        "completion_tokens_details": {"reasoning_tokens": "2"},
    },
}
ANTHROPIC_ODD_USAGE = {
    "a string": {"input_tokens": "100", "output_tokens": 5},
    "true": {"input_tokens": 10, "output_tokens": True},
    "a fraction": {"input_tokens": 10, "output_tokens": 1.9},
    "a string cache read": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": "7"},
    "a fractional thinking count": {"input_tokens": 10, "output_tokens": 5, "output_tokens_details": {"thinking_tokens": 0.5}},
}


@pytest.mark.parametrize("usage", OPENAI_ODD_USAGE.values(), ids=OPENAI_ODD_USAGE.keys())
async def test_an_openai_token_count_that_is_not_a_whole_number_is_a_bad_reply(
    both: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, usage: dict[str, Any]
) -> None:
    model.script("odd", lambda body: Reply(raw=completion({"role": "assistant", "content": "hi"}, usage=usage)))
    _, result = await run(both, await create(both, agent("odd")), "odd", "go")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_PROVIDER_BAD_REPLY), result
    assert "is not a whole number" in result.text and result.total_tokens == 0


@pytest.mark.parametrize("usage", ANTHROPIC_ODD_USAGE.values(), ids=ANTHROPIC_ODD_USAGE.keys())
async def test_an_anthropic_token_count_that_is_not_a_whole_number_is_a_bad_reply(
    both: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer, usage: dict[str, Any]
) -> None:
    anthropic.script("claude", lambda body: Turn(raw=anthropic_message([{"type": "text", "text": "hi"}], usage)))
    runtime_id = await create(both, agent("a", model="claude", provider="anthropic"))
    _, result = await run(both, runtime_id, "a", "go")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_PROVIDER_BAD_REPLY), result
    assert "is not a whole number" in result.text and result.total_tokens == 0


async def test_whole_token_counts_written_as_decimals_are_read(
    both: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
) -> None:
    usage = {"prompt_tokens": 100.0, "completion_tokens": 5, "total_tokens": 105.0}
    model.script("decimal", lambda body: Reply(raw=completion({"role": "assistant", "content": "hi"}, usage=usage)))
    _, result = await run(both, await create(both, agent("decimal")), "decimal", "go")
    assert (result.status, result.total_tokens, result.own_usage.input_tokens) == (pb.STATUS_DONE, 105, 100), result
    anthropic.script(
        "claude",
        lambda body: Turn(raw=anthropic_message([{"type": "text", "text": "hi"}], {"input_tokens": 10.0, "output_tokens": 5})),
    )
    _, result = await run(both, await create(both, agent("a", model="claude", provider="anthropic")), "a", "go")
    assert (result.status, result.total_tokens) == (pb.STATUS_DONE, 15), result


@pytest.mark.parametrize("usage", [{"input_tokens": None, "output_tokens": None}, {"service_tier": "standard"}, None])
async def test_anthropic_usage_without_figures_is_estimated_not_zero(
    both: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer, usage: Any
) -> None:
    anthropic.script("claude", lambda body: Turn(raw=anthropic_message([{"type": "text", "text": "x" * 4000}], usage)))
    runtime_id = await create(both, agent("a", model="claude", provider="anthropic"))
    _, result = await run(both, runtime_id, "a", "go")
    assert result.status == pb.STATUS_DONE, result
    assert result.total_tokens >= 1000, result  # about four characters a token


# ---- Retry-After ----


@pytest.mark.parametrize(
    "headers",
    [{"retry-after-ms": "nan"}, {"Retry-After": "nan"}, {"Retry-After": "Mon, 01 Jan 99999999999999999999 00:00:00 GMT"}],
    ids=["nan ms", "nan s", "a year past any clock"],
)
async def test_a_retry_after_that_is_no_time_falls_back_to_the_backoff(
    both: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, headers: dict[str, str]
) -> None:
    model.script(
        "m", first_then(Reply(status=429, raw='{"error": {"message": "slow"}}', headers=headers), Reply(text="ok", tokens=3))
    )
    started = time.monotonic()
    _, result = await asyncio.wait_for(run(both, await create(both, agent("m")), "m", "go"), 10)
    assert (result.status, result.text, result.total_tokens) == (pb.STATUS_DONE, "ok", 3), result
    assert time.monotonic() - started < 5


# ---- a filtered reply with calls ----


async def test_a_filtered_reply_with_tool_calls_leaves_the_transcript_sendable(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    filtered = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ask"}}],
    }
    model.script("f", first_then(Reply(raw=completion(filtered, "content_filter")), Reply(text="second answer", tokens=2)))
    runtime_id = await create(stub, agent("f"))
    handle_id, result = await run(stub, runtime_id, "f", "first")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_MODEL_REFUSED), result
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="second"))
    second = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).result
    assert second.status == pb.STATUS_DONE, second
    sent = model.requests[-1]["messages"]
    answered = {call["id"] for message in sent for call in message.get("tool_calls") or []}
    assert all(message["tool_call_id"] in answered for message in sent if message["role"] == "tool"), sent


# ---- secrets ----


class KeyQuoting(Loopback):
    """A model API that answers 400 quoting the key just before the error excerpt's cut."""

    key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghij"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._answer)

    async def _answer(self, request: web.Request) -> web.Response:
        body = '{"error": {"message": "' + "x" * 440 + " your key " + self.key + '"}}'
        return web.Response(status=400, text=body, content_type="application/json")


class Recording(Loopback):
    """Another origin (its own port): records the headers it is sent."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/elsewhere", self._record)

    async def _record(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        return web.Response(text=anthropic_message([{"type": "text", "text": "stolen"}]), content_type="application/json")


class Redirecting(Loopback):
    """A model API that redirects every call to another origin."""

    def __init__(self, to: Recording) -> None:
        self.to = to

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{path:.*}", self._redirect)

    async def _redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://127.0.0.1:{self.to.port}/elsewhere")


async def test_no_part_of_the_key_is_in_an_error_excerpt() -> None:
    server = KeyQuoting()
    await server.start()
    try:
        async with serve(llm_style="openai", llm_base_url=f"http://127.0.0.1:{server.port}/v1", llm_api_key=server.key) as served:
            _, result = await run(served.stub, await create(served.stub, agent("a")), "a", "go")
    finally:
        await server.stop()
    assert result.failure.reason == pb.FAILURE_REASON_PROVIDER_BAD_REQUEST, result
    assert "x" * 100 in result.text, result.text  # the excerpt is there
    assert server.key[:8] not in result.text and server.key[:8] not in result.failure.detail, result


async def test_a_redirect_is_not_followed_and_the_key_goes_nowhere_else() -> None:
    elsewhere = Recording()
    await elsewhere.start()
    server = Redirecting(elsewhere)
    await server.start()
    try:
        async with serve(
            llm_style="anthropic", llm_base_url=f"http://127.0.0.1:{server.port}", llm_api_key=ANTHROPIC_KEY
        ) as served:
            _, result = await run(served.stub, await create(served.stub, agent("a")), "a", "go")
    finally:
        await server.stop()
        await elsewhere.stop()
    assert elsewhere.seen == []
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_PROVIDER_BAD_REQUEST), result
    assert "redirect" in result.text and ANTHROPIC_KEY not in result.text, result.text


# ---- a pending Request whose data no Struct can carry ----


class HugeNumber(Loopback):
    def routes(self, app: web.Application) -> None:
        app.router.add_post("/t", self._answer)

    async def _answer(self, request: web.Request) -> web.Response:
        body = '{"kind": "approval", "prompt": "ok?", "data": {"n": 1' + "0" * 400 + "}}"
        return web.Response(status=202, text=body, content_type="application/json")


async def test_a_pending_request_with_a_number_past_a_double_is_an_error_result(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    tool = HugeNumber()
    await tool.start()
    try:
        model.script("a", lambda body: Reply(calls=[("t", {})]) if tool_results(body) == 0 else Reply(text="done"))
        runtime_id = await create(stub, agent("a", tools=[http_tool("t", f"http://127.0.0.1:{tool.port}/t")]))
        handle_id = await spawn(stub, runtime_id, "a")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
        result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).result
    finally:
        await tool.stop()
    assert (result.status, result.text) == (pb.STATUS_DONE, "done"), result
    [tool_message] = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert "'data' must be JSON a Struct can carry: data.n is an integer past a double's range" in tool_message["content"]


async def test_anthropics_input_and_max_tokens_over_the_context_is_context_length_exceeded(
    both: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer
) -> None:
    error = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, "
            "decrease input length or `max_tokens` and try again",
        },
    }
    anthropic.script("claude", lambda body: Turn(status=400, raw=json.dumps(error)))
    runtime_id = await create(both, agent("a", model="claude", provider="anthropic"))
    _, result = await run(both, runtime_id, "a", "go")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_CONTEXT_LENGTH_EXCEEDED), result
