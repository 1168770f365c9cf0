"""Stops and failures from the model APIs (issue 11), against scripted OpenAI and Anthropic
APIs whose replies are the official SDKs' reply models with every field present, and whose
recorded request bodies are validated here against the SDKs' request types (strictly: no
undeclared key, every message and block checked): a body that stops validating fails the
test that sent it.

For both providers: a truncated reply is INCOMPLETE LIMIT_MAX_OUTPUT_TOKENS and its calls
never run; a refusal is ERROR MODEL_REFUSED and stays in the transcript and in the next
request; the APIs' documented errors become named Failures; missing usage is estimated and
budgets still bite; Anthropic thinking blocks go back verbatim."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anthropic.types as at
import pydantic
import pydantic_core
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, http_tool, run, transcript, views
from tests.support.sdk_servers import (
    ANTHROPIC_REQUEST,
    OPENAI_REQUEST,
    Answer,
    Model,
    SdkServer,
    answered,
    anthropic_error,
    anthropic_reply,
    anthropic_usage,
    openai_error,
    openai_reply,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)
from tests.support.servers import serve
from tests.support.tool_server import ToolServer

OPENAI_KEY = "sk-sdk-openai-secret-never-shown"
ANTHROPIC_KEY = "sk-ant-sdk-secret-never-shown"
KEYS = (OPENAI_KEY, ANTHROPIC_KEY)
PING_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


@dataclass
class Api:
    """One provider under test: its name in the server's settings and its scripted API."""

    name: str
    server: SdkServer

    def reply(
        self, model: str, text: str | None = None, calls: list[tuple[str, dict[str, Any]]] | None = None, stop: str = ""
    ) -> Model:
        """`stop`: "" (complete), "truncated" or "refusal", in this API's words."""
        if self.name == "openai":
            if stop == "refusal":
                return openai_reply(model, None, refusal=text)
            return openai_reply(model, text, calls, finish="length" if stop == "truncated" else None)
        native = {"truncated": "max_tokens", "refusal": "refusal"}.get(stop)
        return anthropic_reply(model, text, calls, stop=native)


@pytest.fixture
async def sdk() -> AsyncIterator[dict[str, SdkServer]]:
    servers = {"openai": SdkServer("openai"), "anthropic": SdkServer("anthropic")}
    for server in servers.values():
        await server.start()
    try:
        yield servers
        for server in servers.values():
            server.valid_requests()  # a safety net: each test validates its own bodies first
    finally:
        for server in servers.values():
            await server.stop()


@pytest.fixture
async def stub(sdk: dict[str, SdkServer]) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    """`openai` (the default provider), `anthropic` and `anthropic-512` (its own output cap);
    one retry after a fault, with a tiny backoff."""
    anthropic_url = sdk["anthropic"].base_url
    async with serve(
        llm_style="openai",
        llm_base_url=sdk["openai"].base_url,
        llm_api_key=OPENAI_KEY,
        llm_max_retries=1,
        llm_backoff_base=0.01,
        llm_backoff_max=0.05,
        providers={
            "anthropic": {"style": "anthropic", "base_url": anthropic_url, "api_key": ANTHROPIC_KEY},
            "anthropic-512": {
                "style": "anthropic",
                "base_url": anthropic_url,
                "api_key": ANTHROPIC_KEY,
                "max_output_tokens": 512,
            },
        },
    ) as served:
        yield served.stub


@pytest.fixture(params=["openai", "anthropic"])
def api(request: pytest.FixtureRequest, sdk: dict[str, SdkServer]) -> Api:
    return Api(request.param, sdk[request.param])


def by_call(*replies: Callable[[dict[str, Any]], Model | Answer]) -> Callable[[dict[str, Any]], Model | Answer]:
    """A script answering its n-th call with replies[n] (the last one repeats)."""
    calls: list[int] = []

    def script(body: dict[str, Any]) -> Model | Answer:
        calls.append(1)
        return replies[min(len(calls), len(replies)) - 1](body)

    return script


async def post_and_wake(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str, text: str) -> pb.TaskResult:
    await stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text=text))
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id))
    return (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id))).result


async def turn_ends(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> list[pb.TurnEnded]:
    """The handle's TurnEnded events, from the runtime's history up to its settled result."""
    ended: list[pb.TurnEnded] = []
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=0))
    async for response in call:
        event = response.event
        if event.handle_id != handle_id:
            continue
        if event.WhichOneof("payload") == "turn_ended":
            ended.append(event.turn_ended)
        elif event.WhichOneof("payload") == "result":
            call.cancel()
            break
    return ended


def assistant_turns(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [message for message in body["messages"] if message["role"] == "assistant"]


def assert_alternates(body: dict[str, Any]) -> None:
    """Anthropic's rule: user and assistant turns alternate, starting with user."""
    roles = [message["role"] for message in body["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles)), roles


# ---- the validators themselves -------------------------------------------------------------


def test_the_request_validators_refuse_what_the_sdk_types_do_not_declare() -> None:
    openai_ok: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "refusal": "no"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "out"},
        ],
        "max_completion_tokens": 64,
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": PING_SCHEMA}}],
    }
    anthropic_ok: dict[str, Any] = {
        "model": "m",
        "max_tokens": 64,
        "system": "be brief",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "t", "name": "f", "input": {}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "out", "is_error": True}]},
        ],
        "tools": [{"name": "f", "description": "d", "input_schema": PING_SCHEMA}],
    }
    OPENAI_REQUEST.validate(openai_ok)
    ANTHROPIC_REQUEST.validate(anthropic_ok)

    def first_message(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
        return {**body, "messages": [{**body["messages"][0], **changes}, *body["messages"][1:]]}

    openai_bad = [
        {**openai_ok, "max_output_tokens": 64},  # not a chat/completions parameter
        first_message(openai_ok, name_of_sender="x"),
        {**openai_ok, "messages": [*openai_ok["messages"], {"role": "model", "content": "x"}]},
        {**openai_ok, "messages": [*openai_ok["messages"], {"role": "tool", "content": "no call id"}]},
    ]
    anthropic_bad = [
        {**anthropic_ok, "max_completion_tokens": 64},
        first_message(anthropic_ok, turn=1),
        first_message(anthropic_ok, content=[{"type": "text", "text": "hi", "is_error": True}]),
        first_message(anthropic_ok, content=[{"type": "text", "text": None}]),
        {key: value for key, value in anthropic_ok.items() if key != "max_tokens"},
    ]
    for validator, bodies in ((OPENAI_REQUEST, openai_bad), (ANTHROPIC_REQUEST, anthropic_bad)):
        for body in bodies:
            with pytest.raises((pydantic_core.ValidationError, AssertionError)):
                validator.validate(body)
    # Why the validators tighten the adapters: the plain ones let an undeclared key and a
    # bad message through (a lazy Iterable is checked only when iterated).
    plain = pydantic.TypeAdapter(OPENAI_REQUEST.params)
    plain.validate_python({**openai_ok, "max_output_tokens": 64}, strict=True)
    plain.validate_python({**openai_ok, "messages": [{"role": "model"}]}, strict=True)


# ---- truncation -----------------------------------------------------------------------------


async def test_a_truncated_reply_is_incomplete_and_its_calls_never_run(
    stub: pb_grpc.AgentRuntimeAsyncStub, api: Api, tools: ToolServer
) -> None:
    api.server.script(
        "lead",
        by_call(
            lambda body: api.reply("lead", "The answer is", [("ping", {"n": 1})], stop="truncated"),
            lambda body: api.reply("lead", "done"),
        ),
    )
    lead = agent("lead", provider=api.name, tools=[http_tool("ping", tools.url("ping"), PING_SCHEMA)], max_output_tokens=64)
    runtime_id = await create(stub, lead)

    handle_id, result = await run(stub, runtime_id, "lead", "go")

    assert (result.status, result.limit, result.text) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_OUTPUT_TOKENS, "The answer is")
    assert tools.hits["ping"] == 0
    [first] = api.server.valid_requests()
    if api.name == "openai":
        assert first["max_completion_tokens"] == 64 and "max_tokens" not in first
    else:
        assert first["max_tokens"] == 64
    messages = await transcript(stub, runtime_id, handle_id)
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    cut, answer = messages[1], messages[2]
    assert cut.truncated and not cut.refusal and cut.content == "The answer is"
    assert [call.name for call in cut.tool_calls] == ["ping"]
    assert answer.tool_call_id == cut.tool_calls[0].id and answer.is_error and answer.content.startswith("not run: ")

    # The handle goes on: the cut-off turn and its error answer are sent, and validate.
    again = await post_and_wake(stub, runtime_id, handle_id, "go on")
    assert (again.status, again.text) == (pb.STATUS_DONE, "done")
    assert tools.hits["ping"] == 0
    _, second = api.server.valid_requests()
    assert answered(second) == 1
    if api.name == "anthropic":
        assert_alternates(second)
        # The API wants a tool_use answered first thing in the next user turn.
        after = second["messages"][2]["content"]
        assert [block["type"] for block in after] == ["tool_result", "text"] and "go on" in after[1]["text"]
        assert after[0]["is_error"] is True and after[0]["content"].startswith("not run: ")


async def test_the_output_cap_sent_when_the_agent_sets_none(stub: pb_grpc.AgentRuntimeAsyncStub, api: Api) -> None:
    api.server.script("lead", lambda body: api.reply("lead", "short"))
    providers = [api.name] + (["anthropic-512"] if api.name == "anthropic" else [])
    runtime_id = await create(stub, *(agent(f"lead{index}", "lead", provider=name) for index, name in enumerate(providers)))
    for index in range(len(providers)):
        assert (await run(stub, runtime_id, f"lead{index}", "go"))[1].status == pb.STATUS_DONE
    bodies = api.server.valid_requests()
    if api.name == "openai":
        assert not {"max_completion_tokens", "max_tokens"} & set(bodies[0])
    else:
        assert [body["max_tokens"] for body in bodies] == [4096, 512]


async def test_a_truncated_child_is_an_error_task_result(stub: pb_grpc.AgentRuntimeAsyncStub, api: Api) -> None:
    api.server.script(
        "lead",
        lambda body: (
            api.reply("lead", "handled")
            if answered(body)
            else api.reply("lead", None, [("task", {"agent": "worker", "prompt": "dig"})])
        ),
    )
    api.server.script("worker", lambda body: api.reply("worker", "half an ans", stop="truncated"))
    runtime_id = await create(stub, agent("lead", provider=api.name, team=["worker"]), agent("worker", provider=api.name))

    handle_id, result = await run(stub, runtime_id, "lead", "delegate")

    assert (result.status, result.text) == (pb.STATUS_DONE, "handled")
    [child] = [view for view in (await views(stub, runtime_id)).values() if view.agent == "worker"]
    assert child.last_status == pb.STATUS_INCOMPLETE
    messages = await transcript(stub, runtime_id, handle_id)
    [tool] = [m for m in messages if m.role == "tool"]
    assert tool.is_error and "half an ans" in tool.content and "LIMIT_MAX_OUTPUT_TOKENS" in tool.content
    bodies = api.server.valid_requests()
    second_lead = [body for body in bodies if body["model"] == "lead"][1]
    if api.name == "anthropic":
        [block] = [b for m in second_lead["messages"] if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"]
        assert block["is_error"] is True


# ---- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "refusal", "expected"),
    [
        ("openai", "I can't help with that.", "I can't help with that."),
        ("anthropic", "I won't do that.", "I won't do that."),
        ("anthropic", None, ""),  # a refusal with no text block at all
    ],
    ids=["openai", "anthropic-text", "anthropic-empty"],
)
async def test_a_refusal_is_an_error_kept_in_the_transcript_and_the_next_request(
    stub: pb_grpc.AgentRuntimeAsyncStub, sdk: dict[str, SdkServer], provider: str, refusal: str | None, expected: str
) -> None:
    api = Api(provider, sdk[provider])
    api.server.script(
        "lead", by_call(lambda body: api.reply("lead", refusal, stop="refusal"), lambda body: api.reply("lead", "fine then"))
    )
    runtime_id = await create(stub, agent("lead", provider=provider))

    handle_id, result = await run(stub, runtime_id, "lead", "do the thing")

    assert result.status == pb.STATUS_ERROR and result.is_error
    assert (result.failure.reason, result.failure.provider, result.text) == (pb.FAILURE_REASON_MODEL_REFUSED, provider, expected)
    messages = await transcript(stub, runtime_id, handle_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].refusal and messages[1].content == expected and not messages[1].truncated

    again = await post_and_wake(stub, runtime_id, handle_id, "please, it is for a test")
    assert (again.status, again.text) == (pb.STATUS_DONE, "fine then")
    _, second = api.server.valid_requests()
    [declined] = assistant_turns(second)
    if provider == "openai":
        assert declined == {"role": "assistant", "content": None, "refusal": expected}
    else:
        assert declined == {
            "role": "assistant",
            "content": [{"type": "text", "text": expected or "(the model declined to answer)"}],
        }
        assert_alternates(second)
    assert second["messages"][-1]["role"] == "user"


async def test_an_openai_content_filter_stop_is_a_refusal(stub: pb_grpc.AgentRuntimeAsyncStub, sdk: dict[str, SdkServer]) -> None:
    sdk["openai"].script("lead", lambda body: openai_reply("lead", "Here is how to", finish="content_filter"))
    runtime_id = await create(stub, agent("lead"))
    _, result = await run(stub, runtime_id, "lead", "go")
    assert (result.status, result.failure.reason, result.failure.provider) == (
        pb.STATUS_ERROR,
        pb.FAILURE_REASON_MODEL_REFUSED,
        "openai",
    )
    sdk["openai"].valid_requests()


# ---- provider failures ----------------------------------------------------------------------


def _failure_cases() -> list[Any]:
    long_prompt = "This model's maximum context length is 128000 tokens. However, your messages resulted in 210000 tokens."
    cases = [
        # provider, status, body, reason, retryable, in detail, attempts
        ("openai", 400, openai_error(long_prompt, "invalid_request_error", "context_length_exceeded", "messages"),
         pb.FAILURE_REASON_CONTEXT_LENGTH_EXCEEDED, False, "context_length_exceeded", 1),
        ("anthropic", 400, anthropic_error(at.InvalidRequestError, "prompt is too long: 210000 tokens > 200000 maximum"),
         pb.FAILURE_REASON_CONTEXT_LENGTH_EXCEEDED, False, "invalid_request_error", 1),
        ("openai", 401, openai_error(f"Incorrect API key provided: {OPENAI_KEY}.", "invalid_request_error", "invalid_api_key"),
         pb.FAILURE_REASON_PROVIDER_AUTH, False, "invalid_api_key", 1),
        ("anthropic", 401, anthropic_error(at.AuthenticationError, f"invalid x-api-key: {ANTHROPIC_KEY}"),
         pb.FAILURE_REASON_PROVIDER_AUTH, False, "authentication_error", 1),
        ("openai", 429, openai_error("Rate limit reached for requests", "requests", "rate_limit_exceeded"),
         pb.FAILURE_REASON_PROVIDER_RATE_LIMITED, True, "rate_limit_exceeded", 2),
        ("anthropic", 429, anthropic_error(at.RateLimitError, "Number of request tokens has exceeded your rate limit"),
         pb.FAILURE_REASON_PROVIDER_RATE_LIMITED, True, "rate_limit_error", 2),
        ("openai", 429, openai_error("You exceeded your current quota", "insufficient_quota", "insufficient_quota"),
         pb.FAILURE_REASON_PROVIDER_RATE_LIMITED, False, "insufficient_quota", 1),
        ("openai", 500, openai_error("The server had an error while processing your request.", "server_error"),
         pb.FAILURE_REASON_PROVIDER_UNAVAILABLE, True, "server_error", 2),
        ("anthropic", 529, anthropic_error(at.OverloadedError, "Overloaded"),
         pb.FAILURE_REASON_PROVIDER_UNAVAILABLE, True, "overloaded_error", 2),
        ("anthropic", 500, anthropic_error(at.APIErrorObject, "Internal server error"),
         pb.FAILURE_REASON_PROVIDER_UNAVAILABLE, True, "api_error", 2),
        ("openai", 400, openai_error("Invalid schema.", "invalid_request_error", "invalid_function_parameters", "tools"),
         pb.FAILURE_REASON_PROVIDER_BAD_REQUEST, False, "invalid_function_parameters", 1),
        ("anthropic", 400, anthropic_error(at.InvalidRequestError, "tools.0.custom.input_schema: JSON schema is invalid"),
         pb.FAILURE_REASON_PROVIDER_BAD_REQUEST, False, "invalid_request_error", 1),
        ("anthropic", 404, anthropic_error(at.NotFoundError, "model: lead"),
         pb.FAILURE_REASON_PROVIDER_BAD_REQUEST, False, "not_found_error", 1),
        # A 200 that is not the API's reply: the other API's (a base_url pointed at the wrong one).
        ("openai", 200, anthropic_reply("lead", "hi"), pb.FAILURE_REASON_PROVIDER_BAD_REPLY, False, "not a chat completion", 1),
        ("anthropic", 200, openai_reply("lead", "hi"), pb.FAILURE_REASON_PROVIDER_BAD_REPLY, False, "not a message", 1),
        ("anthropic", 200, anthropic_reply("lead", "hal", stop="model_context_window_exceeded"),
         pb.FAILURE_REASON_CONTEXT_LENGTH_EXCEEDED, False, "model_context_window_exceeded", 1),
    ]  # fmt: skip
    return [
        pytest.param(*case, id=f"{case[0]}-{case[1]}-{pb.FailureReason.Name(case[3]).removeprefix('FAILURE_REASON_')}")
        for case in cases
    ]


@pytest.mark.parametrize(("provider", "status", "body", "reason", "retryable", "detail", "attempts"), _failure_cases())
async def test_provider_failures_have_names(
    stub: pb_grpc.AgentRuntimeAsyncStub,
    sdk: dict[str, SdkServer],
    provider: str,
    status: int,
    body: dict[str, Any] | Model,
    reason: pb.FailureReason.ValueType,
    retryable: bool,
    detail: str,
    attempts: int,
) -> None:
    server = sdk[provider]
    answer = Answer(reply=body, status=status) if isinstance(body, Model) else Answer(body=body, status=status)
    server.script("lead", lambda request: answer)
    runtime_id = await create(stub, agent("lead", provider=provider))

    _, result = await run(stub, runtime_id, "lead", "go")

    assert result.status == pb.STATUS_ERROR and result.is_error
    failure = result.failure
    assert (pb.FailureReason.Name(failure.reason), failure.provider, failure.http_status, failure.retryable) == (
        pb.FailureReason.Name(reason),
        provider,
        status,
        retryable,
    )
    assert detail in failure.detail, failure.detail
    for key in KEYS:
        assert key not in failure.detail and key not in result.text
    assert server.calls["lead"] == attempts
    assert len(server.valid_requests()) == attempts


# ---- usage ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "usage"),
    [("openai", "absent"), ("openai", "null"), ("openai", "reported"), ("anthropic", "reported")],
)
async def test_missing_usage_is_estimated_and_said_so(
    stub: pb_grpc.AgentRuntimeAsyncStub, sdk: dict[str, SdkServer], tools: ToolServer, provider: str, usage: str
) -> None:
    api = Api(provider, sdk[provider])

    def reply(model: str, text: str | None, calls: list[tuple[str, dict[str, Any]]] | None = None) -> Model | Answer:
        if provider == "anthropic":
            return anthropic_reply(model, text, calls, usage=anthropic_usage(20, 10, cache_write=5, cache_read=7))
        completion = openai_reply(model, text, calls, usage=(20, 10) if usage == "reported" else None)
        if usage != "absent":
            return completion
        body = completion.model_dump(mode="json", exclude_none=False)
        del body["usage"]
        return Answer(body=body)

    api.server.script(
        "lead", lambda body: reply("lead", "pinged") if answered(body) else reply("lead", None, [("ping", {"n": 1})])
    )
    lead = agent(
        "lead",
        provider=provider,
        instructions="Ping once, then say so.",
        tools=[http_tool("ping", tools.url("ping"), PING_SCHEMA)],
    )
    runtime_id = await create(stub, lead)

    handle_id, result = await run(stub, runtime_id, "lead", "Please ping the service and report back.")

    assert (result.status, result.text, tools.hits["ping"]) == (pb.STATUS_DONE, "pinged", 1)
    ends = await turn_ends(stub, runtime_id, handle_id)
    assert [end.turn for end in ends] == [1, 2]
    tokens = [end.tokens for end in ends]
    assert result.own_tokens == sum(tokens) and [end.own_tokens for end in ends] == [tokens[0], sum(tokens)]
    if usage == "reported":
        assert not any(end.usage_estimated for end in ends)
        assert tokens == ([30, 30] if provider == "openai" else [42, 42])
    else:
        assert all(end.usage_estimated for end in ends)
        assert 0 < tokens[0] < tokens[1]  # the second request carries the first turn too
    api.server.valid_requests()


async def test_a_token_budget_stops_a_run_on_estimated_usage(
    stub: pb_grpc.AgentRuntimeAsyncStub, sdk: dict[str, SdkServer], tools: ToolServer
) -> None:
    server = sdk["openai"]
    server.script("lead", lambda body: openai_reply("lead", None, [("ping", {"n": answered(body)})], usage=None))
    lead = agent("lead", tools=[http_tool("ping", tools.url("ping"), PING_SCHEMA)], budget=pb.Budget(max_tokens=200))
    runtime_id = await create(stub, lead)

    handle_id, result = await run(stub, runtime_id, "lead", "Ping the service until you are told to stop, please. " * 4)

    # The first turn's reservation (its input, about 110 tokens at four characters a token) fits;
    # the second's does not fit beside the first's estimated usage: counted as 0, it would.
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TOKENS), result
    assert server.calls["lead"] == 1 and result.own_tokens >= 100, result
    [end] = await turn_ends(stub, runtime_id, handle_id)
    assert end.usage_estimated and end.tokens == result.own_tokens
    server.valid_requests()


# ---- thinking -------------------------------------------------------------------------------


async def test_thinking_blocks_go_back_verbatim_and_first(
    stub: pb_grpc.AgentRuntimeAsyncStub, sdk: dict[str, SdkServer], tools: ToolServer
) -> None:
    server = sdk["anthropic"]
    thought = "The user wants a ping. Let me call it — once."
    signature = "EqQBCkYIBhgCIkBy+7/sig==\n"
    redacted = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
    blocks: list[Model] = [
        thinking_block(thought, signature),
        redacted_thinking_block(redacted),
        text_block("Pinging."),
        tool_use_block(1, "ping", {"n": 1}),
    ]
    server.script(
        "lead",
        lambda body: (
            anthropic_reply("lead", "pinged") if answered(body) else anthropic_reply("lead", blocks=blocks, stop="tool_use")
        ),
    )
    lead = agent("lead", provider="anthropic", tools=[http_tool("ping", tools.url("ping"), PING_SCHEMA)])
    runtime_id = await create(stub, lead)

    handle_id, result = await run(stub, runtime_id, "lead", "ping it")

    assert (result.status, result.text) == (pb.STATUS_DONE, "pinged")
    _, second = server.valid_requests()
    assert_alternates(second)
    [turn] = [message for message in second["messages"] if message["role"] == "assistant"]
    assert turn["content"][:2] == [
        {"type": "thinking", "thinking": thought, "signature": signature},
        {"type": "redacted_thinking", "data": redacted},
    ]
    assert [block["type"] for block in turn["content"][2:]] == ["text", "tool_use"]
    assert turn["content"][2]["text"] == "Pinging." and turn["content"][3]["input"] == {"n": 1}
    messages = await transcript(stub, runtime_id, handle_id)
    [made] = [m for m in messages if m.role == "assistant" and m.tool_calls]
    assert [(t.text, t.signature, t.redacted_data) for t in made.thinking] == [(thought, signature, ""), ("", "", redacted)]
