"""A scripted Anthropic messages API on loopback, for tests.

Like the OpenAI-compatible one: each model name has a script, a function from the request
body to a reply; the server keeps every request body and its headers. A reply's usage is
the SDK's own type, as it serializes it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from anthropic.types import Usage

from tests.support.loopback import ScriptedServer


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

    async def _messages(self, request: web.Request) -> web.Response:
        body, model, script = await self.receive(request)
        if script is None:
            error = {"type": "error", "error": {"type": "not_found_error", "message": f"model: {model}"}}
            return web.json_response(error, status=404)
        turn = script(body)
        if turn.delay:
            await asyncio.sleep(turn.delay)
        if turn.raw is not None:
            return web.Response(status=turn.status, text=turn.raw, content_type="application/json", headers=turn.headers)
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
