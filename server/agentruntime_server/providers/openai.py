"""OpenAI-compatible chat/completions over the shared keep-alive session."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from ..domain.model import Message, ToolCall
from ..domain.ports import ModelReply, ModelRequest, ProviderError
from ..http_session import HttpSession


class OpenAIProvider:
    def __init__(self, session: HttpSession, base_url: str, api_key: str, default_model: str, timeout: float) -> None:
        self._session = session
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._default_model = default_model
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def complete(self, request: ModelRequest) -> ModelReply:
        body: dict[str, Any] = {
            "model": request.agent.model or self._default_model,
            "messages": [_wire_message(message) for message in request.messages],
        }
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
        try:
            async with self._session.get().post(
                self._url, data=json.dumps(body), headers=self._headers, timeout=self._timeout
            ) as response:
                raw = await response.read()
                if response.status >= 300:
                    raise ProviderError(
                        self._redact(f"provider answered HTTP {response.status}: {raw[:500].decode('utf-8', 'replace')}")
                    )
        except TimeoutError as exc:
            raise ProviderError(f"provider did not answer within {self._timeout.total}s") from exc
        except aiohttp.ClientError as exc:
            raise ProviderError(self._redact(f"provider unreachable: {type(exc).__name__}: {exc}")) from exc
        return _parse(raw)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def _parse(raw: bytes) -> ModelReply:
    try:
        payload = json.loads(raw)
        choice = payload["choices"][0]["message"]
        calls = tuple(
            ToolCall(
                id=str(call.get("id", "")),
                name=call["function"]["name"],
                arguments_json=call["function"].get("arguments") or "{}",
            )
            for call in choice.get("tool_calls") or ()
        )
        usage = payload.get("usage") or {}
        tokens = usage.get("total_tokens")
        if tokens is None:
            tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
        return ModelReply(text=choice.get("content") or "", tool_calls=calls, tokens=int(tokens))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ProviderError(f"provider reply is not a chat completion ({type(exc).__name__}: {exc})") from exc
