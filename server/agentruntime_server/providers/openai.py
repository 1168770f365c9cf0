"""OpenAI-compatible chat/completions (OpenAI, OpenRouter, vLLM, llama.cpp, ...)."""

from __future__ import annotations

import json
from typing import Any

from ..domain.billing.usage import Tokens
from ..domain.ports import ModelReply, ModelRequest, ReplyStream
from ..domain.vocabulary import Message, ReplyStop, ToolCall
from ..http import HttpClient
from .base import CallPolicy, HttpProvider, reply_count, reply_string
from .streaming import ChatCompletionStream
from .structured import openai_response_format


class OpenAIProvider(HttpProvider):
    kind = "chat completion"

    def __init__(
        self,
        http: HttpClient,
        *,
        base_url: str,
        api_key: str,
        default_model: str,
        timeout: float,
        policy: CallPolicy,
        name: str = "openai",
    ) -> None:
        super().__init__(
            name,
            http,
            url=base_url.rstrip("/") + "/chat/completions",
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            api_key=api_key,
            default_model=default_model,
            timeout=timeout,
            policy=policy,
        )

    def body(self, request: ModelRequest, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": [_wire_message(message) for message in request.messages]}
        if request.agent.max_output_tokens is not None:
            body["max_completion_tokens"] = request.agent.max_output_tokens
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
        if request.agent.output_schema is not None:
            body["response_format"] = openai_response_format(request.agent.output_schema)
        if request.cache_key:
            # Routes this handle's requests to the machines holding its prefix (docs/usage.md#prompt-caching).
            body["prompt_cache_key"] = request.cache_key
        return body

    def ask_to_stream(self, body: dict[str, Any]) -> None:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # the last chunk carries the usage

    def stream_reader(self, stream: ReplyStream) -> ChatCompletionStream:
        return ChatCompletionStream(stream)

    def parse(self, payload: Any, model: str) -> ModelReply:
        first = payload["choices"][0]
        choice = first["message"]
        calls = tuple(
            ToolCall(
                id=str(call.get("id", "")),
                name=reply_string(call["function"]["name"], "a tool call's function name"),
                arguments_json=_arguments(call["function"].get("arguments")),
            )
            for call in choice.get("tool_calls") or ()
        )
        refusal = choice.get("refusal")
        finish = first.get("finish_reason")
        if refusal:
            return ModelReply(str(refusal), (), usage_of(payload.get("usage")), ReplyStop.REFUSAL, model=model)
        stop = {"length": ReplyStop.MAX_OUTPUT_TOKENS, "content_filter": ReplyStop.REFUSAL}.get(finish, ReplyStop.COMPLETE)
        # A filtered reply's calls are never run, and are not sent back either: a request
        # holding them would need their results.
        calls = () if stop is ReplyStop.REFUSAL else calls
        return ModelReply(_content(choice.get("content")), calls, usage_of(payload.get("usage")), stop, model=model)


def usage_of(usage: Any) -> Tokens | None:
    """The split of a chat completion's `usage` (docs/usage.md): `prompt_tokens` less
    `prompt_tokens_details.cached_tokens` is input at the base rate, the cached part cache
    reads; `completion_tokens` is output, `completion_tokens_details.reasoning_tokens` the
    reasoning in it. (OpenAI bills no cache writes.) A server that reports only
    `total_tokens` has it counted as input; None when it reported no usage."""
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if prompt is None and completion is None:
        total = usage.get("total_tokens")
        return None if total is None else Tokens(input=reply_count(total, "usage.total_tokens"))
    cached = reply_count(
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens"
    )
    reasoning = reply_count(
        (usage.get("completion_tokens_details") or {}).get("reasoning_tokens"), "usage.completion_tokens_details.reasoning_tokens"
    )
    prompt, completion = reply_count(prompt, "usage.prompt_tokens"), reply_count(completion, "usage.completion_tokens")
    if not 0 <= cached <= prompt or not 0 <= reasoning <= completion:
        raise ValueError(
            f"usage details larger than their totals ({cached} cached of {prompt}, {reasoning} reasoning of {completion})"
        )
    return Tokens(input=prompt - cached, cache_read=cached, output=completion, reasoning=reasoning)


def _content(value: Any) -> str:
    """The message's text: a string (or null), or, from some compatible servers, a list of
    text parts."""
    if value is None:
        return ""
    if isinstance(value, list):
        return "".join(reply_string(part.get("text"), "a content part's text") for part in value if part.get("type") == "text")
    return reply_string(value, "the message content")


def _arguments(value: Any) -> str:
    """A JSON string per the API; some compatible servers send the object itself."""
    if not value:
        return "{}"
    return value if isinstance(value, str) else json.dumps(value)


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "assistant" and message.refusal:
        return {"role": "assistant", "content": None, "refusal": message.content}
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
