"""The embedded, offline, deterministic model.

With a script (AgentDef.script) reply i answers the call made after i assistant messages
in the transcript, so a host in any language can test its workflow without a key. With no
script, a generic behaviour that makes the shipped example agents do something sensible:
delegate the prompt to every team mate, then sum up what they returned."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from ..domain.billing.usage import Tokens
from ..domain.ports import ModelReply, ModelRequest, ProviderError, ReplyStream
from ..domain.vocabulary import AgentSpec, Failure, FailureReason, Message, ReplyStop, ToolCall


class ScriptedProvider:
    def __init__(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """`sleep`: how a scripted delay or pause waits (a test's clock moves it by hand)."""
        self.sleep = sleep

    def reply_bound(self, agent: AgentSpec) -> None:
        """Nothing is reserved for its turns: offline, its figures are its script's (or its
        deterministic estimate), not what a request of that size would cost a provider."""
        return None

    async def complete(self, request: ModelRequest) -> ModelReply:
        script = request.agent.script
        if not script:
            generic = _generic(request)
            if request.stream is not None:
                await _stream(request.stream, generic.text, generic.tool_calls, self.sleep)
            return generic
        answered = sum(1 for message in request.messages if message.role == "assistant")
        reply = script[min(answered, len(script) - 1)]
        if reply.delay:
            await self.sleep(reply.delay)
        if reply.stop is ReplyStop.PROVIDER_UNAVAILABLE:
            failure = Failure(FailureReason.PROVIDER_UNAVAILABLE, "scripted", 503, True, "the script says the provider fails")
            raise ProviderError("provider 'scripted' answered HTTP 503 (scripted failure)", failure)
        calls = tuple(
            ToolCall(id=f"scripted_{index}", name=call.name, arguments_json=call.arguments_json or "{}")
            for index, call in enumerate(reply.tool_calls, start=1)
        )
        if request.stream is not None:
            await _stream(request.stream, reply.text, calls, self.sleep, reply.stream_chunk_chars, reply.stream_pause)
        usage = reply.usage if reply.usage is not None else Tokens(output=reply.tokens)
        return ModelReply(text=reply.text, tool_calls=calls, usage=usage, stop=reply.stop, model=_model(request))


async def _stream(
    stream: ReplyStream,
    text: str,
    calls: tuple[ToolCall, ...],
    sleep: Callable[[float], Awaitable[None]],
    chunk: int = 0,
    pause: float = 0.0,
) -> None:
    """The reply's text in pieces of `chunk` characters (all of it in one when 0), `pause`
    seconds apart, then each tool call in one piece: what a streaming provider hands over,
    offline."""
    size = chunk or len(text) or 1
    for start in range(0, len(text), size):
        if start and pause:
            await sleep(pause)
        stream.text(text[start : start + size])
    for index, call in enumerate(calls):
        stream.tool_call(index, call.name, call.arguments_json)


def _generic(request: ModelRequest) -> ModelReply:
    agent = request.agent
    conversation = [message for message in request.messages if message.role != "system"]
    last = conversation[-1]
    if last.role == "user" and agent.team:
        calls = tuple(
            ToolCall(id=f"generic_{index}", name="task", arguments_json=json.dumps({"agent": member, "prompt": last.content}))
            for index, member in enumerate(sorted(agent.team), start=1)
        )
        return ModelReply(text="", tool_calls=calls, usage=_tokens(request.messages, ""), model=_model(request))
    if last.role == "tool":
        results = []
        for message in reversed(conversation):
            if message.role != "tool":
                break
            results.append(message.content)
        text = f"{agent.name}: " + " | ".join(reversed(results))
    else:
        first_line = last.content.strip().splitlines()[0] if last.content.strip() else ""
        text = f"{agent.name} on {first_line!r}: done."
    return ModelReply(text=text, tool_calls=(), usage=_tokens(request.messages, text), model=_model(request))


def _tokens(messages: tuple[Message, ...], reply: str) -> Tokens:
    """Deterministic usage: about four characters a token, as real tokenizers roughly do;
    the prompt as input, the rest (the reply) as output."""
    prompt = sum(len(message.content) for message in messages)
    total = (prompt + len(reply)) // 4 + 1
    return Tokens(input=min(prompt // 4 + 1, total), output=total - min(prompt // 4 + 1, total))


def _model(request: ModelRequest) -> str:
    return request.agent.model or "scripted"
