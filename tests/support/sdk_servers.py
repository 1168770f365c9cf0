"""Model API fakes whose every reply is an object of the official SDKs' reply models
(`openai.types.chat.ChatCompletion`, `anthropic.types.Message`, and their error objects),
built with every field present and served as `model_dump(mode="json")` with the nulls kept;
and validators that hold every request body the runtime sends to the SDKs' request types
(`CompletionCreateParamsNonStreaming`, `MessageCreateParamsNonStreaming`).

The validators are stricter than a bare `TypeAdapter(...).validate_python(strict=True)`,
which (checked in tests/api/test_provider_stops.py) lets both of these through:

- extra keys: pydantic ignores keys a TypedDict does not declare (and the Anthropic SDK's
  reply models, which its params accept as content blocks, allow extras);
- `Iterable[...]` fields (`messages`, content block lists): validated lazily, only when the
  result is iterated, so a bad message would pass `validate_python`.

So the adapter's core schema is tightened before use: every TypedDict and model forbids
extra keys, and every lazy iterable is validated as a list, eagerly."""

from __future__ import annotations

import copy
import json
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic.types as at
import openai.types.chat as oc
import pydantic
from aiohttp import web
from anthropic.types import message_create_params
from openai.types import completion_usage
from openai.types.chat import chat_completion, completion_create_params
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.shared import ErrorObject
from pydantic_core import SchemaValidator

from tests.support.loopback import ScriptedServer

Model = pydantic.BaseModel


# ---- request validation --------------------------------------------------------------------


def _tighten(schema: Any) -> Any:
    if isinstance(schema, dict):
        if schema.get("type") == "generator":  # Iterable[...]: lazy in pydantic; a JSON body has lists
            schema["type"] = "list"
        if schema.get("type") in ("typed-dict", "model-fields"):
            schema["extra_behavior"] = "forbid"
        for value in schema.values():
            _tighten(value)
    elif isinstance(schema, list):
        for value in schema:
            _tighten(value)
    return schema


class RequestValidator:
    """One SDK request TypedDict, as a strict validator of recorded JSON bodies."""

    def __init__(self, params: Any, message_param: Any) -> None:
        self.params = params
        self.adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(params)
        self.strict = SchemaValidator(_tighten(copy.deepcopy(self.adapter.core_schema)))
        # The message TypedDict for each role, for the explicit key check.
        self.messages = {typing.get_args(typing.get_type_hints(td)["role"])[0]: td for td in typing.get_args(message_param)}

    def validate(self, body: dict[str, Any]) -> dict[str, Any]:
        """Raises (pydantic_core.ValidationError or AssertionError) unless the body is one the
        SDK's request type accepts with no undeclared key; returns the body."""
        self.strict.validate_python(body, strict=True)
        self.adapter.validate_python(body, strict=True)  # the plain adapter agrees
        undeclared = set(body) - set(self.params.__annotations__)
        assert not undeclared, f"keys the SDK's {self.params.__name__} does not declare: {sorted(undeclared)}"
        for index, message in enumerate(body["messages"]):
            declared = self.messages[message["role"]].__annotations__
            undeclared = set(message) - set(declared)
            assert not undeclared, f"messages[{index}] has keys its SDK type does not declare: {sorted(undeclared)}"
        return body


OPENAI_REQUEST = RequestValidator(completion_create_params.CompletionCreateParamsNonStreaming, oc.ChatCompletionMessageParam)
ANTHROPIC_REQUEST = RequestValidator(message_create_params.MessageCreateParamsNonStreaming, at.MessageParam)


# ---- replies built from the SDK models, every field present ----------------------------------


M = typing.TypeVar("M", bound=Model)


def full(cls: type[M], **values: Any) -> M:
    """An SDK model with every one of its fields given (None where not said): `model_fields_set`
    is all of them, so the dump carries every field, nulls included."""
    unknown = set(values) - set(cls.model_fields)
    assert not unknown, f"{cls.__name__} has no fields {sorted(unknown)}"
    return cls(**{name: values.get(name) for name in cls.model_fields})


def assert_every_field(model: Any, where: str = "reply") -> None:
    """Every SDK model in the tree was built with all its fields."""
    if isinstance(model, Model):
        missing = set(type(model).model_fields) - model.model_fields_set
        assert not missing, f"{where} ({type(model).__name__}) lacks {sorted(missing)}"
        for name in type(model).model_fields:
            assert_every_field(getattr(model, name), f"{where}.{name}")
    elif isinstance(model, list | tuple):
        for index, item in enumerate(model):
            assert_every_field(item, f"{where}[{index}]")
    elif isinstance(model, dict):
        for key, item in model.items():
            assert_every_field(item, f"{where}.{key}")


def dump(model: Model) -> dict[str, Any]:
    assert_every_field(model)
    body: dict[str, Any] = model.model_dump(mode="json", exclude_none=False, exclude_unset=False, by_alias=True)
    return body


def openai_usage(prompt: int, completion: int) -> completion_usage.CompletionUsage:
    return full(
        completion_usage.CompletionUsage,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        completion_tokens_details=full(
            completion_usage.CompletionTokensDetails,
            accepted_prediction_tokens=0,
            audio_tokens=0,
            reasoning_tokens=0,
            rejected_prediction_tokens=0,
            text_tokens=completion,
        ),
        prompt_tokens_details=full(
            completion_usage.PromptTokensDetails,
            audio_tokens=0,
            cache_write_tokens=0,
            cached_tokens=0,
            image_tokens=0,
            text_tokens=prompt,
        ),
    )


def openai_reply(
    model: str,
    text: str | None = None,
    calls: list[tuple[str, dict[str, Any]]] | None = None,
    *,
    finish: str | None = None,
    refusal: str | None = None,
    usage: tuple[int, int] | None = (20, 10),
) -> oc.ChatCompletion:
    """A chat completion; `finish` defaults to `tool_calls` with calls, else `stop`."""
    tool_calls = [
        full(
            oc.ChatCompletionMessageFunctionToolCall,
            id=f"call_{index}",
            type="function",
            function=full(Function, name=name, arguments=json.dumps(args)),
        )
        for index, (name, args) in enumerate(calls or [], start=1)
    ]
    message = full(
        oc.ChatCompletionMessage,
        role="assistant",
        content=text,
        refusal=refusal,
        annotations=[],
        tool_calls=tool_calls or None,
    )
    choice = full(chat_completion.Choice, index=0, message=message, finish_reason=finish or ("tool_calls" if calls else "stop"))
    return full(
        oc.ChatCompletion,
        id="chatcmpl-sdk",
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[choice],
        metadata={},
        service_tier="default",
        system_fingerprint="fp_sdk",
        usage=openai_usage(*usage) if usage is not None else None,
    )


def openai_error(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: `{"error": <ErrorObject>}`."""
    return {"error": dump(full(ErrorObject, message=message, type=kind, code=code, param=param))}


def anthropic_usage(input_tokens: int, output_tokens: int, cache_write: int = 0, cache_read: int = 0) -> at.Usage:
    return full(
        at.Usage,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_creation_input_tokens=cache_write,
        cache_read_input_tokens=cache_read,
        cache_creation=full(at.CacheCreation, ephemeral_1h_input_tokens=0, ephemeral_5m_input_tokens=cache_write),
        service_tier="standard",
    )


def text_block(text: str) -> at.TextBlock:
    return full(at.TextBlock, type="text", text=text, citations=None)


def tool_use_block(index: int, name: str, args: dict[str, Any]) -> at.ToolUseBlock:
    return full(
        at.ToolUseBlock,
        type="tool_use",
        id=f"toolu_{index:02d}",
        name=name,
        input=args,
        caller=full(at.DirectCaller, type="direct"),
    )


def thinking_block(thinking: str, signature: str) -> at.ThinkingBlock:
    return full(at.ThinkingBlock, type="thinking", thinking=thinking, signature=signature)


def redacted_thinking_block(data: str) -> at.RedactedThinkingBlock:
    return full(at.RedactedThinkingBlock, type="redacted_thinking", data=data)


def anthropic_reply(
    model: str,
    text: str | None = None,
    calls: list[tuple[str, dict[str, Any]]] | None = None,
    *,
    stop: str | None = None,
    blocks: list[Model] | None = None,
    usage: at.Usage | None = None,
) -> at.Message:
    """A message; `blocks` replaces the text and tool_use blocks made from `text` and `calls`;
    `stop` defaults to `tool_use` with calls, else `end_turn`."""
    if blocks is None:
        blocks = [text_block(text)] if text else []
        blocks += [tool_use_block(index, name, args) for index, (name, args) in enumerate(calls or [], start=1)]
    stop = stop or ("tool_use" if calls else "end_turn")
    details = (
        full(at.RefusalStopDetails, type="refusal", category="general_harms", explanation=None) if stop == "refusal" else None
    )
    return full(
        at.Message,
        id="msg_sdk",
        type="message",
        role="assistant",
        model=model,
        content=blocks,
        stop_reason=stop,
        stop_sequence=None,
        stop_details=details,
        usage=usage or anthropic_usage(20, 10),
    )


def anthropic_error(kind: type[Model], message: str) -> dict[str, Any]:
    """Anthropic's error body: an `ErrorResponse` around one of its error objects."""
    error = full(kind, type=typing.get_args(kind.model_fields["type"].annotation)[0], message=message)
    return dump(full(at.ErrorResponse, type="error", error=error, request_id="req_sdk"))


# ---- the servers -----------------------------------------------------------------------------


@dataclass
class Answer:
    """What a script answers: an SDK reply object, or a JSON body (an error object, a reply
    with a field taken out), with a status and headers."""

    reply: Model | None = None
    body: dict[str, Any] | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


Script = Callable[[dict[str, Any]], Answer | Model]


class SdkServer(ScriptedServer[Answer | Model]):
    """One API (`openai` at /v1/chat/completions, `anthropic` at /v1/messages); each model
    name has a script (request body -> reply). Every request body is kept."""

    def __init__(self, api: str) -> None:
        super().__init__()
        self.api = api
        self.validator = OPENAI_REQUEST if api == "openai" else ANTHROPIC_REQUEST
        self.path = "/v1/chat/completions" if api == "openai" else "/v1/messages"

    def routes(self, app: web.Application) -> None:
        app.router.add_post(self.path, self._answer)

    def valid_requests(self) -> list[dict[str, Any]]:
        """Every request body so far, each validated against the SDK's request type."""
        return [self.validator.validate(body) for body in self.requests]

    async def _answer(self, request: web.Request) -> web.Response:
        body, model, script = await self.receive(request)
        if script is None:
            return web.json_response({"error": {"message": f"no script for model {model}"}}, status=404)
        answer = script(body)
        if isinstance(answer, Model):
            answer = Answer(reply=answer)
        payload = dump(answer.reply) if answer.reply is not None else answer.body
        return web.json_response(payload, status=answer.status, headers=answer.headers)


def answered(body: dict[str, Any]) -> int:
    """How many tool results a request body carries (either API)."""
    count = 0
    for message in body["messages"]:
        if message["role"] == "tool":
            count += 1
        elif message["role"] == "user" and isinstance(message["content"], list):
            count += sum(1 for block in message["content"] if block["type"] == "tool_result")
    return count
