"""Model API replies and tool answers from a review: odd shapes, Retry-After values, a
filtered reply with calls, usage without figures, a key across the error excerpt's cut, a
redirect, and a pending Request a Struct cannot carry. Real servers on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from aiohttp import web

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.build import agent, create, http_tool, run, spawn
from tests.support.loopback import Loopback
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.servers import serve

KEY = "sk-test-secret-never-shown"
ANTHROPIC_KEY = "sk-ant-secret-never-shown"


@pytest.fixture
async def both(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> AsyncIterator[pb_grpc.AgentRuntimeStub]:
    """OpenAI-style by default, and an `anthropic` provider."""
    async with serve(
        llm_style="openai",
        llm_base_url=model.base_url,
        llm_api_key=KEY,
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
    both: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, message: dict[str, Any]
) -> None:
    model.script("odd", lambda body: Reply(raw=completion({"role": "assistant", **message}, "tool_calls")))
    _, result = await run(both, await create(both, agent("odd")), "odd", "go")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_PROVIDER_BAD_REPLY), result


async def test_openai_content_as_text_parts_is_read(both: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
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
    both: pb_grpc.AgentRuntimeStub, anthropic: ScriptedAnthropicServer, content: list[dict[str, Any]]
) -> None:
    anthropic.script("claude", lambda body: Turn(raw=anthropic_message(content)))
    runtime_id = await create(both, agent("a", model="claude", provider="anthropic"))
    _, result = await run(both, runtime_id, "a", "go")
    assert (result.status, result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_PROVIDER_BAD_REPLY), result


@pytest.mark.parametrize("usage", [{"input_tokens": None, "output_tokens": None}, {"service_tier": "standard"}, None])
async def test_anthropic_usage_without_figures_is_estimated_not_zero(
    both: pb_grpc.AgentRuntimeStub, anthropic: ScriptedAnthropicServer, usage: Any
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
    both: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, headers: dict[str, str]
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
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
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
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
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
    assert "numbers a double can carry" in tool_message["content"], tool_message


async def test_anthropics_input_and_max_tokens_over_the_context_is_context_length_exceeded(
    both: pb_grpc.AgentRuntimeStub, anthropic: ScriptedAnthropicServer
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
