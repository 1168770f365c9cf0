"""Anthropic's messages API: the system prompt as `system`, tool calls as `tool_use`
blocks, their results as `tool_result` blocks in the next user turn."""

from __future__ import annotations

import json
from typing import Any

from ..domain.billing.usage import Tokens
from ..domain.ports import ModelReply, ModelRequest, ProviderError, ReplyStream
from ..domain.vocabulary import AgentSpec, FailureReason, Message, ReplyStop, Thinking, ToolCall
from ..http import HttpClient
from .base import CallPolicy, HttpProvider, reply_count, reply_string
from .streaming import MessageStream
from .structured import anthropic_output_config

API_VERSION = "2023-06-01"


class AnthropicProvider(HttpProvider):
    kind = "message"

    def __init__(
        self,
        http: HttpClient,
        *,
        base_url: str,
        api_key: str,
        default_model: str,
        timeout: float,
        policy: CallPolicy,
        max_output_tokens: int = 4096,
        name: str = "anthropic",
    ) -> None:
        headers = {"anthropic-version": API_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        super().__init__(
            name,
            http,
            url=base_url.rstrip("/") + "/messages",
            headers=headers,
            api_key=api_key,
            default_model=default_model,
            timeout=timeout,
            policy=policy,
        )
        self._max_output_tokens = max_output_tokens

    def output_cap(self, agent: AgentSpec) -> int:
        return agent.max_output_tokens or self._max_output_tokens  # the API requires one

    def body(self, request: ModelRequest, model: str) -> dict[str, Any]:
        system = "\n\n".join(message.content for message in request.messages if message.role == "system" and message.content)
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": self.output_cap(request.agent),
            "messages": wire_messages(request.messages),
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools]
        if request.agent.output_schema is not None:
            body["output_config"] = anthropic_output_config(request.agent.output_schema)
        if request.agent.prompt_cache:
            mark_cache_breakpoints(body)
        return body

    def stream_reader(self, stream: ReplyStream) -> MessageStream:
        return MessageStream(stream)

    def parse(self, payload: Any, model: str) -> ModelReply:
        if payload.get("type") == "error":
            raise ValueError(f"an error object: {payload.get('error')}")
        texts: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[Thinking] = []
        for block in payload["content"]:
            if block["type"] == "text":
                texts.append(reply_string(block["text"], "a text block's text"))
            elif block["type"] == "tool_use":
                name = reply_string(block["name"], "a tool_use block's name")
                calls.append(ToolCall(id=str(block["id"]), name=name, arguments_json=json.dumps(block["input"])))
            elif block["type"] == "thinking":
                signature = reply_string(block.get("signature") or "", "a thinking block's signature")
                thinking.append(Thinking(text=reply_string(block["thinking"], "a thinking block's text"), signature=signature))
            elif block["type"] == "redacted_thinking":
                thinking.append(Thinking(redacted_data=reply_string(block["data"], "a redacted_thinking block's data")))
        stop_reason = payload.get("stop_reason")
        if stop_reason == "model_context_window_exceeded":
            raise ProviderError(
                f"provider {self.name!r} stopped the reply: the context window is full",
                self._failure(FailureReason.CONTEXT_LENGTH_EXCEEDED, 200, "model_context_window_exceeded"),
            )
        stop = {"max_tokens": ReplyStop.MAX_OUTPUT_TOKENS, "refusal": ReplyStop.REFUSAL}.get(stop_reason, ReplyStop.COMPLETE)
        return ModelReply("".join(texts), tuple(calls), usage_of(payload.get("usage")), stop, tuple(thinking), model)


def usage_of(usage: Any) -> Tokens | None:
    """The split of a message's `usage` (docs/usage.md): `input_tokens` (input after the
    last cache breakpoint, at the base rate), `cache_read_input_tokens`,
    `cache_creation_input_tokens` (cache writes) and `output_tokens` (thinking included);
    `output_tokens_details.thinking_tokens`, where the API reports it, is the reasoning part
    of output. None when it reported no figures."""
    usage = usage or {}
    keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")
    if all(usage.get(key) is None for key in keys):
        return None  # no figures, so estimated
    figures = [reply_count(usage.get(key), f"usage.{key}") for key in keys]
    thinking = reply_count(
        (usage.get("output_tokens_details") or {}).get("thinking_tokens"), "usage.output_tokens_details.thinking_tokens"
    )
    if not 0 <= thinking <= figures[3]:
        raise ValueError(f"usage details larger than their totals ({thinking} thinking of {figures[3]} output)")
    return Tokens(input=figures[0], cache_read=figures[1], cache_write=figures[2], output=figures[3], reasoning=thinking)


CACHE_BREAKPOINT = {"type": "ephemeral"}
# Thinking blocks cannot carry a breakpoint (the API refuses one there).
_UNMARKABLE = {"thinking", "redacted_thinking"}


def mark_cache_breakpoints(body: dict[str, Any]) -> None:
    """Prompt caching (docs/usage.md#prompt-caching): a breakpoint on the last tool, on the
    system prompt (then a list of text blocks) and on the last block of the conversation so
    far. The API caches the prefix up to each, in its order tools, system, messages, so each
    turn reads the one before from the cache and writes its own tail: three of the four
    breakpoints a request may carry."""
    if body.get("tools"):
        body["tools"][-1]["cache_control"] = dict(CACHE_BREAKPOINT)
    if body.get("system"):
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": dict(CACHE_BREAKPOINT)}]
    if body["messages"]:
        markable = [block for block in body["messages"][-1]["content"] if block["type"] not in _UNMARKABLE]
        if markable:
            markable[-1]["cache_control"] = dict(CACHE_BREAKPOINT)


def wire_messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """The transcript as alternating user/assistant turns of content blocks (system excluded)."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        blocks: list[dict[str, Any]]
        if message.role == "tool":
            role = "user"
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}
            if message.is_error:
                result["is_error"] = True
            blocks = [result]
        elif message.role == "assistant":
            role = "assistant"
            blocks = [_thinking_block(thinking) for thinking in message.thinking]
            text = message.content or (EMPTY_REFUSAL if message.refusal else "" if message.tool_calls else EMPTY_REPLY)
            blocks += [{"type": "text", "text": text}] if text else []
            blocks += [
                {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments_json)}
                for call in message.tool_calls
            ]
        else:
            role = "user"
            blocks = [{"type": "text", "text": message.content}] if message.content else []
        if not blocks:
            continue  # the API refuses empty text blocks
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)  # consecutive turns of one role become one turn
        else:
            wire.append({"role": role, "content": blocks})
    return wire


# An assistant turn is never dropped from a request (request and transcript agree), but the
# API refuses empty text blocks: an empty reply is sent as this marker.
EMPTY_REPLY = "(no reply)"
EMPTY_REFUSAL = "(the model declined to answer)"


def _thinking_block(thinking: Thinking) -> dict[str, Any]:
    """Sent back verbatim, signature included: the API checks it once thinking is on."""
    if thinking.redacted_data:
        return {"type": "redacted_thinking", "data": thinking.redacted_data}
    return {"type": "thinking", "thinking": thinking.text, "signature": thinking.signature}


def _input(arguments_json: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments_json or "{}")
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}
