"""A scripted Anthropic messages API on loopback, for tests.

Like the OpenAI-compatible one: each model name has a script, a function from the request
body to a reply; the server keeps every request body and its headers. A reply's usage is
the SDK's own type, as it serializes it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from anthropic.types import (
    InputJSONDelta,
    Message,
    MessageDeltaUsage,
    RawContentBlockDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    RawMessageStreamEvent,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
    Usage,
)
from anthropic.types.raw_content_block_start_event import ContentBlock
from anthropic.types.raw_message_delta_event import Delta

from tests.support.loopback import ScriptedServer
from tests.support.sse import Streamed, pieces, send


@dataclass
class Turn:
    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    input_tokens: int = 10
    output_tokens: int = 5
    delay: float = 0.0
    status: int = 200
    raw: str | None = None  # sent verbatim instead of a message
    headers: dict[str, str] = field(default_factory=dict)
    usage: Usage | None = None  # instead of input_tokens and output_tokens alone
    # Streamed (when the request asks): how; a thinking block first (with its signature); the
    # stop reason (None: by the turn); an `error` event after `error_after` events; pings.
    streamed: Streamed = field(default_factory=Streamed)
    thinking: str = ""
    signature: str = "c2lnbmF0dXJl"
    stop_reason: str | None = None
    error: dict[str, Any] | None = None
    error_after: int = 0
    pings: bool = True


Script = Callable[[dict[str, Any]], Turn]


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool_result block the transcript holds so far."""
    return [
        block
        for message in body["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]


class ScriptedAnthropicServer(ScriptedServer[Turn]):
    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._messages)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body, model, script = await self.receive(request)
        if script is None:
            error = {"type": "error", "error": {"type": "not_found_error", "message": f"model: {model}"}}
            return web.json_response(error, status=404)
        turn = script(body)
        if turn.delay:
            await asyncio.sleep(turn.delay)
        if turn.raw is not None:
            return web.Response(status=turn.status, text=turn.raw, content_type="application/json", headers=turn.headers)
        if body.get("stream"):
            return await send(request, message_events(turn, model), turn.streamed)
        content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
        content += [
            {"type": "tool_use", "id": f"toolu_{index:02d}", "name": name, "input": args}
            for index, (name, args) in enumerate(turn.calls, start=1)
        ]
        return web.json_response(
            {
                "id": "msg_test",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": "tool_use" if turn.calls else "end_turn",
                "stop_sequence": None,
                "usage": (turn.usage or Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens)).model_dump(
                    exclude_none=True
                ),
            },
            headers=turn.headers,
        )


def message_events(turn: Turn, model: str) -> list[tuple[str | None, str]]:
    """The turn as the messages API streams it, each event the SDK's own type: message_start,
    a ping, each block's start, deltas and stop, message_delta, message_stop."""
    usage = turn.usage or Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens)
    started = Message(
        id="msg_test",
        type="message",
        role="assistant",
        model=model,
        content=[],
        stop_reason=None,
        stop_sequence=None,
        usage=Usage(
            input_tokens=usage.input_tokens,
            output_tokens=1,
            cache_read_input_tokens=usage.cache_read_input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens,
        ),
    )
    size = turn.streamed.chunk
    events: list[RawMessageStreamEvent] = [RawMessageStartEvent(type="message_start", message=started)]
    blocks: list[tuple[ContentBlock, list[RawContentBlockDelta]]] = []
    if turn.thinking:
        thinking = [ThinkingDelta(type="thinking_delta", thinking=p) for p in pieces(turn.thinking, size)]
        signed: list[RawContentBlockDelta] = [*thinking, SignatureDelta(type="signature_delta", signature=turn.signature)]
        blocks.append((ThinkingBlock(type="thinking", thinking="", signature=""), signed))
    if turn.text:
        blocks.append((TextBlock(type="text", text=""), [TextDelta(type="text_delta", text=p) for p in pieces(turn.text, size)]))
    for index, (name, args) in enumerate(turn.calls, start=1):
        started_call = ToolUseBlock(type="tool_use", id=f"toolu_{index:02d}", name=name, input={})
        parts: list[RawContentBlockDelta] = [
            InputJSONDelta(type="input_json_delta", partial_json=p) for p in pieces(json.dumps(args), size)
        ]
        blocks.append((started_call, parts))
    for index, (block, deltas) in enumerate(blocks):
        events.append(RawContentBlockStartEvent(type="content_block_start", index=index, content_block=block))
        events += [RawContentBlockDeltaEvent(type="content_block_delta", index=index, delta=d) for d in deltas]
        events.append(RawContentBlockStopEvent(type="content_block_stop", index=index))
    stop = turn.stop_reason or ("tool_use" if turn.calls else "end_turn")
    events.append(
        RawMessageDeltaEvent(
            type="message_delta",
            delta=Delta(stop_reason=stop, stop_sequence=None),  # type: ignore[arg-type]  # a script may stop for a reason the SDK does not list
            usage=MessageDeltaUsage(output_tokens=usage.output_tokens),
        )
    )
    events.append(RawMessageStopEvent(type="message_stop"))
    sent: list[tuple[str | None, str]] = [(str(e.type), e.model_dump_json(exclude_none=True)) for e in events]
    if turn.pings:
        sent.insert(1, ("ping", json.dumps({"type": "ping"})))
    if turn.error is not None:
        sent.insert(turn.error_after, ("error", json.dumps({"type": "error", "error": turn.error})))
    return sent
