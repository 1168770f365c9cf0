"""Streamed replies from the OpenAI- and Anthropic-shaped servers (their SDKs' own stream
events, with pauses between them): what reaches a watcher as it comes, and what the
transcript keeps, exactly as from a whole reply (docs/streaming.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from anthropic.types import Usage as AnthropicUsage

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.build import agent, create, spawn, transcript, wait
from tests.support.deltas import Watched, joined, watch
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.sse import Streamed

TEXT = "A reply that arrives in pieces, each a little later than the one before."
SLOW = Streamed(chunk=10, pause=0.05)


@pytest.fixture
async def stub(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    from tests.support.servers import serve

    providers = {"anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": "sk-ant-test"}}
    async with serve(
        llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", providers=providers, llm_backoff_base=0.01
    ) as served:
        yield served.stub


async def streamed_run(stub: pb_grpc.AgentRuntimeAsyncStub, definition: pb.AgentDef) -> tuple[str, str, Watched]:
    """Spawns a handle, watches with deltas (subscribed first: its turns stream), wakes it, and
    reads until its result."""
    runtime_id = await create(stub, definition)
    handle_id = await spawn(stub, runtime_id, definition.name)
    watching = asyncio.ensure_future(watch(stub, runtime_id, handle_id))
    await asyncio.sleep(0.1)
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    return runtime_id, handle_id, await watching


def kinds(deltas: list[pb.Delta]) -> list[str]:
    return [str(d.WhichOneof("piece")) for d in deltas]


# ---- OpenAI-compatible ---------------------------------------------------------------------


async def test_openai_text_reaches_the_watcher_before_the_provider_has_finished(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    streamed = Streamed(chunk=10, pause=0.1)
    model.script("writer", lambda body: Reply(text=TEXT, tokens=30, streamed=streamed))
    runtime_id = await create(stub, agent("writer"))
    handle_id = await spawn(stub, runtime_id, "writer")
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, deltas=True), timeout=30)
    first = await anext(aiter(call))  # subscribed: the spawned event came
    assert first.event.HasField("spawned")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    seen: list[pb.WatchResponse] = []
    finished_at_first_delta = None
    async for response in call:
        if response.HasField("delta") and finished_at_first_delta is None:
            finished_at_first_delta = streamed.finished
        seen.append(response)
        if response.event.HasField("result"):
            break
    call.cancel()
    assert finished_at_first_delta is False  # the provider was still writing
    assert streamed.finished
    deltas = [r.delta for r in seen if r.HasField("delta")]
    assert [d.index for d in deltas] == list(range(8)) and joined(deltas) == TEXT
    assert (await transcript(stub, runtime_id, handle_id))[-1].content == TEXT
    body = model.requests[-1]
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    result = await wait(stub, runtime_id, handle_id)
    assert (result.status, result.text, result.own_tokens) == (pb.STATUS_DONE, TEXT, 30)
    assert (result.own_usage.input_tokens, result.own_usage.output_tokens) == (15, 15)


async def test_openai_tool_call_arguments_stream_and_the_call_runs_with_them_whole(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    arguments = {"question": "what streams?", "depth": 3}

    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(text="Let me ask.", calls=[("lookup", arguments)], streamed=Streamed(chunk=6))
        return Reply(text="asked", streamed=Streamed(chunk=6))

    model.script("caller", script)
    ask = pb.ToolDef(name="lookup", description="looks up", relay=pb.RelayTool())
    runtime_id, handle_id, watched = await streamed_run(stub, agent("caller", tools=[ask]))
    first_turn = [d for d in watched.of(handle_id) if d.turn == 1]
    calls = [d.tool_call for d in first_turn if d.HasField("tool_call")]
    assert calls[0].name == "lookup" and all(c.index == 0 for c in calls) and all(not c.name for c in calls[1:])
    assert json.loads("".join(c.arguments for c in calls)) == arguments
    assert joined(first_turn) == "Let me ask."
    assert watched.result is not None and watched.result.status == pb.STATUS_PENDING
    kept = (await transcript(stub, runtime_id, handle_id))[-1]
    assert (kept.content, json.loads(kept.tool_calls[0].arguments_json)) == ("Let me ask.", arguments)


async def test_openai_refusal_and_truncation_end_a_streamed_reply_as_a_whole_one(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("refuser", lambda body: Reply(refusal="I cannot help with that.", finish="stop", streamed=SLOW))
    model.script("rambler", lambda body: Reply(text=TEXT, finish="length", streamed=SLOW))
    _, refuser, refused = await streamed_run(stub, agent("refuser"))
    assert joined(refused.of(refuser)) == "I cannot help with that."
    assert refused.result is not None
    assert (refused.result.status, refused.result.failure.reason) == (pb.STATUS_ERROR, pb.FAILURE_REASON_MODEL_REFUSED)
    assert refused.result.text == "I cannot help with that."
    _, rambler, rambled = await streamed_run(stub, agent("rambler"))
    assert joined(rambled.of(rambler)) == TEXT
    assert rambled.result is not None
    assert (rambled.result.status, rambled.result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_OUTPUT_TOKENS)


async def test_openai_error_mid_stream_is_retried_after_a_reset(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    attempts: list[int] = []

    def script(body: dict[str, Any]) -> Reply:
        attempts.append(1)
        if len(attempts) == 1:
            error = {"type": "server_error", "message": "the model crashed mid-reply"}
            return Reply(text=TEXT, streamed=SLOW, error=error, error_after=4)
        return Reply(text=TEXT, tokens=30, streamed=SLOW)

    model.script("flaky", script)
    runtime_id, handle_id, watched = await streamed_run(stub, agent("flaky"))
    pieces = watched.of(handle_id)
    assert kinds(pieces)[:4] == ["text", "text", "text", "reset"]  # 3 pieces (after the role chunk), then the void
    reset = pieces[3]
    assert (reset.index, reset.reset.reason) == (0, "retry")
    assert [d.index for d in pieces[3:]] == list(range(len(pieces) - 3))
    assert joined(pieces) == TEXT and len(attempts) == 2
    assert watched.result is not None and (watched.result.text, watched.result.own_tokens) == (TEXT, 30)
    assert (await transcript(stub, runtime_id, handle_id))[-1].content == TEXT


async def test_openai_connection_cut_mid_stream_is_retried_after_a_reset(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    attempts: list[int] = []

    def script(body: dict[str, Any]) -> Reply:
        attempts.append(1)
        return Reply(text=TEXT, streamed=Streamed(chunk=10, pause=0.05, cut_after=5 if len(attempts) == 1 else None))

    model.script("cut", script)
    _, handle_id, watched = await streamed_run(stub, agent("cut"))
    pieces = watched.of(handle_id)
    assert "reset" in kinds(pieces) and joined(pieces) == TEXT and len(attempts) == 2
    assert watched.result is not None and watched.result.status == pb.STATUS_DONE


async def test_openai_fatal_error_mid_stream_fails_the_run_and_a_garbled_stream_is_a_bad_reply(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    error = {"type": "invalid_request_error", "message": "that is not allowed"}
    model.script("fatal", lambda body: Reply(text=TEXT, streamed=SLOW, error=error, error_after=2))
    _, _, fatal = await streamed_run(stub, agent("fatal"))
    assert fatal.result is not None and fatal.result.status == pb.STATUS_ERROR
    assert fatal.result.failure.reason == pb.FAILURE_REASON_PROVIDER_BAD_REQUEST
    assert "that is not allowed" in fatal.result.failure.detail

    # A chunk that is not JSON: not a stream of chat completion chunks.
    model.script("noise", lambda body: Reply(raw="data: {not json\n\n", status=200))
    _, _, noise = await streamed_run(stub, agent("noise"))
    assert noise.result is not None and noise.result.status == pb.STATUS_ERROR
    assert noise.result.failure.reason == pb.FAILURE_REASON_PROVIDER_BAD_REPLY


# ---- Anthropic ----------------------------------------------------------------------------


def claude(name: str, **fields: Any) -> pb.AgentDef:
    return agent(name, model="claude-test", provider="anthropic", **fields)


async def test_anthropic_thinking_text_and_a_tool_call_stream_and_the_reply_is_kept_whole(
    stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer
) -> None:
    usage = AnthropicUsage(input_tokens=120, cache_read_input_tokens=40, cache_creation_input_tokens=8, output_tokens=64)

    def script(body: dict[str, Any]) -> Turn:
        if len(body["messages"]) == 1:
            return Turn(
                thinking="First I think, then I call.",
                text="Calling now.",
                calls=[("lookup", {"q": "streams"})],
                usage=usage,
                streamed=Streamed(chunk=5, pause=0.01),
            )
        return Turn(text="done", streamed=Streamed(chunk=5))

    anthropic.script("claude-test", script)
    ask = pb.ToolDef(name="lookup", description="looks up", relay=pb.RelayTool())
    runtime_id, handle_id, watched = await streamed_run(stub, claude("thinker", tools=[ask]))
    turn = [d for d in watched.of(handle_id) if d.turn == 1]
    assert "".join(d.thinking for d in turn) == "First I think, then I call."
    assert joined(turn) == "Calling now."
    calls = [d.tool_call for d in turn if d.HasField("tool_call")]
    assert calls[0].name == "lookup" and json.loads("".join(c.arguments for c in calls)) == {"q": "streams"}
    order = kinds(turn)
    assert order.index("thinking") < order.index("text") < order.index("tool_call")
    kept = (await transcript(stub, runtime_id, handle_id))[-1]
    assert kept.content == "Calling now." and kept.thinking[0].text == "First I think, then I call."
    assert kept.thinking[0].signature == "c2lnbmF0dXJl"
    assert json.loads(kept.tool_calls[0].arguments_json) == {"q": "streams"}
    ended = next(e.turn_ended for e in watched.events if e.HasField("turn_ended"))
    assert (ended.usage.input_tokens, ended.usage.cache_read_tokens, ended.usage.cache_write_tokens) == (120, 40, 8)
    assert ended.usage.output_tokens == 64  # from message_delta (message_start said 1)
    # The thinking block goes back with its signature on the next turn.
    assert watched.result is not None and watched.result.status == pb.STATUS_PENDING
    pending = watched.result.pending
    answer = pb.Answer(id=pending.id, ok=True, outputs=[pb.ToolOutput(call_id=pending.calls[0].id, output="found")])
    resumed = await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))
    assert resumed.result.text == "done"
    sent = anthropic.requests[-1]["messages"][1]["content"][0]
    assert sent == {"type": "thinking", "thinking": "First I think, then I call.", "signature": "c2lnbmF0dXJl"}
    assert anthropic.requests[0]["stream"] is True


async def test_anthropic_overloaded_error_event_mid_stream_is_retried_after_a_reset(
    stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer
) -> None:
    attempts: list[int] = []

    def script(body: dict[str, Any]) -> Turn:
        attempts.append(1)
        if len(attempts) == 1:
            return Turn(text=TEXT, streamed=SLOW, error={"type": "overloaded_error", "message": "Overloaded"}, error_after=6)
        return Turn(text=TEXT, streamed=SLOW)

    anthropic.script("claude-test", script)
    _, handle_id, watched = await streamed_run(stub, claude("steady"))
    pieces = watched.of(handle_id)
    assert kinds(pieces).count("reset") == 1 and pieces[kinds(pieces).index("reset")].reset.reason == "retry"
    assert joined(pieces) == TEXT and len(attempts) == 2
    assert watched.result is not None and watched.result.status == pb.STATUS_DONE


async def test_anthropic_refusal_truncation_and_a_fatal_error_event(
    stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer
) -> None:
    anthropic.script("claude-test", lambda body: Turn(text="No.", stop_reason="refusal", streamed=SLOW))
    _, refuser, refused = await streamed_run(stub, claude("refuser"))
    assert refused.result is not None and refused.result.failure.reason == pb.FAILURE_REASON_MODEL_REFUSED
    assert joined(refused.of(refuser)) == "No."
    anthropic.script("claude-test", lambda body: Turn(text=TEXT, stop_reason="max_tokens", streamed=SLOW))
    _, _, cut = await streamed_run(stub, claude("rambler"))
    assert cut.result is not None and cut.result.limit == pb.LIMIT_MAX_OUTPUT_TOKENS and cut.result.text == TEXT
    error = {"type": "invalid_request_error", "message": "bad input"}
    anthropic.script("claude-test", lambda body: Turn(text=TEXT, streamed=SLOW, error=error, error_after=3))
    _, _, failed = await streamed_run(stub, claude("fails"))
    assert failed.result is not None and failed.result.failure.reason == pb.FAILURE_REASON_PROVIDER_BAD_REQUEST
    assert len(anthropic.requests) == 3  # not retried


async def test_a_turn_is_not_streamed_when_nobody_watches_with_deltas(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("quiet", lambda body: Reply(text=TEXT))
    runtime_id = await create(stub, agent("quiet"))
    handle_id = await spawn(stub, runtime_id, "quiet")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    result = await wait(stub, runtime_id, handle_id)
    assert result.text == TEXT
    assert "stream" not in model.requests[-1]


async def test_a_streamed_reply_is_held_to_the_reply_size_and_its_framing_may_be_larger(
    model: ScriptedModelServer,
) -> None:
    from tests.support.servers import serve

    # 30,000 characters in 1,500 events: about 350 KB of framing for a reply under the 64 KiB cap.
    chatty_text, cap = "abcd" * 7500, 64 * 1024
    model.script("chatty", lambda body: Reply(text=chatty_text, streamed=Streamed(chunk=20)))
    model.script("long", lambda body: Reply(text="x" * (cap + 1000), streamed=Streamed(chunk=1000)))
    async with serve(llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", max_model_reply_bytes=cap) as served:
        stub = served.stub
        _, chatty, watched = await streamed_run(stub, agent("chatty"))
        assert watched.result is not None and watched.result.text == chatty_text
        assert joined(watched.of(chatty)) == chatty_text
        _, _, long = await streamed_run(stub, agent("long"))
        assert long.result is not None and long.result.status == pb.STATUS_ERROR
        assert long.result.failure.reason == pb.FAILURE_REASON_PROVIDER_BAD_REPLY
        assert f"over {cap} characters" in long.result.text
