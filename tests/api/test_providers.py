"""Model providers over a real server: Anthropic's messages API end to end, named providers
chosen per agent, and provider faults (429 with Retry-After, 5xx, timeouts, dropped
connections, malformed replies) retried or settled ERROR, never a hang. Backoffs are tiny
here so that every test stays well under the time its faults would take for real."""

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
from agentruntime_server.domain.errors import InvalidArgument
from agentruntime_server.domain.model import AgentSpec, Message
from agentruntime_server.domain.ports import ModelRequest, ProviderError
from agentruntime_server.domain.validation import check_agents
from agentruntime_server.providers.base import retry_after
from agentruntime_server.providers.router import ProviderRouter
from agentruntime_server.providers.scripted import ScriptedProvider
from agentruntime_server.settings import Settings
from multidict import CIMultiDict
from pydantic import ValidationError

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.anthropic_server import tool_results as anthropic_results
from tests.support.build import agent, create, http_tool, run, status_details
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.servers import serve
from tests.support.tool_server import ToolServer

OPENAI_KEY = "sk-test-secret-never-shown"
ANTHROPIC_KEY = "sk-ant-test-secret-never-shown"
MAX_RETRIES = 2  # three attempts in all
BACKOFF_MAX = 0.5


@asynccontextmanager
async def serving(**overrides: Any) -> AsyncIterator[pb_grpc.AgentRuntimeStub]:
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
async def stub(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> AsyncIterator[pb_grpc.AgentRuntimeStub]:
    """Overrides conftest's stub: the same server, with named providers and fast retries."""
    async with serving(**fast_settings(model, anthropic)) as stub:
        yield stub


def timed(replies: list[Reply], then: Reply, times: list[float]) -> Any:
    """A script that answers `replies` in turn, then `then` for ever, noting when each call came."""

    def script(body: dict[str, Any]) -> Reply:
        times.append(time.monotonic())
        return replies[len(times) - 1] if len(times) <= len(replies) else then

    return script


async def still_serves(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, runtime_id: str = "") -> None:
    model.script("healthy", lambda body: Reply(text="fine", tokens=3))
    runtime_id = await create(stub, agent("healthy"))
    _, result = await run(stub, runtime_id, "healthy", "are you there?")
    assert (result.status, result.text) == (pb.STATUS_DONE, "fine")


# ---- anthropic ---------------------------------------------------------------------------


async def test_anthropic_end_to_end(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer, tools: ToolServer
) -> None:
    def lead(body: dict[str, Any]) -> Turn:
        if not anthropic_results(body):
            calls = [("ping", {"n": 1}), ("task", {"agent": "worker", "prompt": "dig"})]
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
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
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


async def test_anthropic_overloaded_is_retried(stub: pb_grpc.AgentRuntimeStub, anthropic: ScriptedAnthropicServer) -> None:
    replies = iter([Turn(status=529, raw='{"type": "error", "error": {"type": "overloaded_error"}}')])
    anthropic.script("claude-test", lambda body: next(replies, Turn(text="calm again", input_tokens=4, output_tokens=2)))
    runtime_id = await create(stub, pb.AgentDef(name="lead", provider="anthropic"))  # no model: the provider's
    _, result = await run(stub, runtime_id, "lead", "go")
    assert (result.status, result.text, result.own_tokens) == (pb.STATUS_DONE, "calm again", 6)
    assert anthropic.calls["claude-test"] == 2


# ---- choosing a provider -----------------------------------------------------------------


async def test_each_agent_runs_on_its_provider_with_its_model_verbatim(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
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


async def test_an_unknown_provider_is_refused_at_create_runtime(stub: pb_grpc.AgentRuntimeStub) -> None:
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
        Settings(providers={"openai": {"api_key": ANTHROPIC_KEY}})


def test_a_key_with_a_line_break_is_refused_at_start_without_being_shown() -> None:
    """A key goes in a header, which cannot carry a line break (a key file's last newline)."""
    for settings in ({"llm_api_key": f"{OPENAI_KEY}\n"}, {"providers": {"other": {"api_key": f"{ANTHROPIC_KEY}\r\n"}}}):
        with pytest.raises(ValidationError) as refused:
            Settings(metrics_listen="off", **settings)  # type: ignore[arg-type]
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


async def test_a_429_burst_honours_retry_after(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
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


async def test_retry_after_is_capped_by_the_max_backoff(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
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


async def test_5xx_then_success_is_retried(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    replies = [Reply(status=500, raw='{"error": "boom"}'), Reply(status=502, raw="<html>bad gateway</html>")]
    model.script("shaky", timed(replies, Reply(text="recovered", tokens=9), []))
    runtime_id = await create(stub, agent("shaky"))
    _, result = await run(stub, runtime_id, "shaky", "go")
    assert (result.status, result.text, result.turns, result.own_tokens) == (pb.STATUS_DONE, "recovered", 1, 9)
    assert model.calls["shaky"] == 3


async def test_5xx_forever_settles_error_after_max_retries(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
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


async def test_a_4xx_is_not_retried(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("picky", lambda body: Reply(status=400, raw='{"error": {"message": "bad tool schema"}}'))
    runtime_id = await create(stub, agent("picky"))
    _, result = await run(stub, runtime_id, "picky", "go")
    assert result.status == pb.STATUS_ERROR and "HTTP 400" in result.text and "bad tool schema" in result.text
    assert model.calls["picky"] == 1


async def test_a_reply_that_never_comes_times_out_each_attempt(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
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
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, raw: str, why: str
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
    stub: pb_grpc.AgentRuntimeStub, anthropic: ScriptedAnthropicServer
) -> None:
    anthropic.script("claude-test", lambda body: Turn(raw='{"type": "message", "content": "not blocks"}'))
    runtime_id = await create(stub, agent("lead", model="claude-test", provider="anthropic"))
    _, result = await run(stub, runtime_id, "lead", "go")
    assert result.status == pb.STATUS_ERROR
    assert "'anthropic' answered HTTP 200 with a reply that is not a message" in result.text


async def test_a_dropped_connection_is_retried(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("flaky", timed([Reply(drop=True)], Reply(text="reconnected", tokens=4), []))
    runtime_id = await create(stub, agent("flaky"))
    _, result = await run(stub, runtime_id, "flaky", "go")
    assert (result.status, result.text) == (pb.STATUS_DONE, "reconnected")
    assert model.calls["flaky"] == 2
    await still_serves(stub, model)


async def test_a_dropped_connection_every_time_settles_error(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
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
