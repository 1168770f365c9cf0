"""A scripted OpenAI-compatible chat/completions server on loopback, for tests.

Each model name has a script: a function from the request body to a reply spec. The
server is stateless per request (replies depend only on the transcript it is sent), and
it counts the calls made for each model. A reply's usage is the SDK's own type, as it
serializes it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import Choice, ChoiceDelta, ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction

from tests.support.loopback import ScriptedServer
from tests.support.sse import Streamed, pieces, send


@dataclass
class Reply:
    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tokens: int = 10
    delay: float = 0.0
    status: int = 200
    raw: str | None = None  # sent verbatim instead of a chat completion
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (Retry-After)
    drop: bool = False  # close the connection instead of answering
    usage: CompletionUsage | None = None  # instead of `tokens` split in halves (prompt, completion)
    # Streamed (when the request asks): how; a refusal's text; the finish reason (None: by the
    # reply); an error object sent as a chunk after `error_after` chunks.
    streamed: Streamed = field(default_factory=Streamed)
    refusal: str = ""
    finish: str | None = None
    error: dict[str, Any] | None = None
    error_after: int = 0


Script = Callable[[dict[str, Any]], Reply]


def tool_results(body: dict[str, Any]) -> int:
    """How many tool results the transcript holds so far."""
    return sum(1 for message in body["messages"] if message["role"] == "tool")


def last_tool_output(body: dict[str, Any]) -> str:
    output: str = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
    return output


def last_user(body: dict[str, Any]) -> str:
    prompt: str = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return prompt


def usage_of(reply: Reply) -> CompletionUsage:
    if reply.usage is not None:
        return reply.usage
    prompt = reply.tokens // 2
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=reply.tokens - prompt, total_tokens=reply.tokens)


class ScriptedModelServer(ScriptedServer[Reply]):
    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.in_flight_bodies: list[dict[str, Any]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._complete)

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body, model, script = await self.receive(request)
        if script is None:
            return web.json_response({"error": {"message": f"no script for model {model}"}}, status=404)
        reply = script(body)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.in_flight_bodies.append(body)
        try:
            if reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            self.in_flight -= 1
            self.in_flight_bodies.remove(body)
        if reply.drop:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=204)  # never reaches the client
        if reply.raw is not None:
            return web.Response(status=reply.status, text=reply.raw, content_type="application/json", headers=reply.headers)
        if body.get("stream"):
            return await send(request, chunks(reply, model), reply.streamed)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.calls:
            message["tool_calls"] = [
                {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for index, (name, args) in enumerate(reply.calls)
            ]
        return web.json_response(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.calls else "stop"}],
                "usage": usage_of(reply).model_dump(exclude_none=True),
            },
            headers=reply.headers,
        )


def chunks(reply: Reply, model: str) -> list[tuple[str | None, str]]:
    """The reply as `chat.completion.chunk` events (the SDK's ChatCompletionChunk), then `[DONE]`."""

    def chunk(delta: ChoiceDelta | None, finish: str | None = None, usage: CompletionUsage | None = None) -> str:
        choices = [] if delta is None else [Choice(index=0, delta=delta, finish_reason=finish)]  # type: ignore[arg-type]
        made = ChatCompletionChunk(
            id="chatcmpl-test", object="chat.completion.chunk", created=0, model=model, choices=choices, usage=usage
        )
        return made.model_dump_json(exclude_unset=True)

    size = reply.streamed.chunk
    events = [chunk(ChoiceDelta(role="assistant", content=""))]
    events += [chunk(ChoiceDelta(content=piece)) for piece in pieces(reply.text, size)]
    events += [chunk(ChoiceDelta(refusal=piece)) for piece in pieces(reply.refusal, size)]
    for index, (name, args) in enumerate(reply.calls):
        call = ChoiceDeltaToolCall(
            index=index, id=f"call_{index}", type="function", function=ChoiceDeltaToolCallFunction(name=name, arguments="")
        )
        events.append(chunk(ChoiceDelta(tool_calls=[call])))
        for piece in pieces(json.dumps(args), size):
            more = ChoiceDeltaToolCall(index=index, function=ChoiceDeltaToolCallFunction(arguments=piece))
            events.append(chunk(ChoiceDelta(tool_calls=[more])))
    finish = reply.finish or ("tool_calls" if reply.calls else "stop")
    events.append(chunk(ChoiceDelta(), finish))
    events.append(chunk(None, usage=usage_of(reply)))
    if reply.error is not None:
        events.insert(reply.error_after, json.dumps({"error": reply.error}))
    return [(None, data) for data in [*events, "[DONE]"]]
