"""Prompt caching on request (`AgentDef.prompt_cache`), over a real server and the scripted
provider servers: Anthropic gets cache breakpoints on the tools, the system prompt and the
conversation so far, OpenAI the handle's prompt cache key; the second turn's usage comes back
as cache reads and writes. An agent without prompt_cache sends neither."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from anthropic.types import Usage as AnthropicUsage
from openai.types import CompletionUsage
from openai.types.completion_usage import PromptTokensDetails

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.anthropic_server import tool_results as anthropic_results
from tests.support.build import agent, create, http_tool, run
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.servers import serve
from tests.support.tool_server import ToolServer

EPHEMERAL = {"type": "ephemeral"}
INSTRUCTIONS = "You keep the ledger. " * 40


@pytest.fixture
async def stub(model: ScriptedModelServer, anthropic: ScriptedAnthropicServer) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    providers = {"anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": "sk-ant-test"}}
    async with serve(llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", providers=providers) as served:
        yield served.stub


def breakpoints(body: Any) -> list[Any]:
    """Every cache_control in a request body, wherever it sits."""
    if isinstance(body, dict):
        return ([body["cache_control"]] if "cache_control" in body else []) + [
            found for key, value in body.items() if key != "cache_control" for found in breakpoints(value)
        ]
    if isinstance(body, list):
        return [found for item in body for found in breakpoints(item)]
    return []


def unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stripped = copy.deepcopy(messages)
    for message in stripped:
        for block in message["content"]:
            block.pop("cache_control", None)
    return stripped


def ledger(agent_name: str, tools: ToolServer, **fields: Any) -> pb.AgentDef:
    ping = http_tool("ping", tools.url("ping"), {"type": "object", "properties": {"n": {"type": "integer"}}})
    return agent(agent_name, model="claude-test", provider="anthropic", instructions=INSTRUCTIONS, tools=[ping], **fields)


# ---- anthropic ---------------------------------------------------------------------------


async def test_anthropic_breakpoints_and_the_second_turn_read_back_as_cache_reads(
    stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer, tools: ToolServer
) -> None:
    def script(body: dict[str, Any]) -> Turn:
        if not anthropic_results(body):  # the first turn writes the prefix to the cache
            usage = AnthropicUsage(input_tokens=12, cache_creation_input_tokens=1800, cache_read_input_tokens=0, output_tokens=30)
            return Turn(calls=[("ping", {"n": 1})], usage=usage)
        usage = AnthropicUsage(input_tokens=9, cache_creation_input_tokens=64, cache_read_input_tokens=1800, output_tokens=21)
        return Turn(text="balanced", usage=usage)

    anthropic.script("claude-test", script)
    runtime_id = await create(stub, ledger("keeper", tools, prompt_cache=True))

    _, result = await run(stub, runtime_id, "keeper", "Balance the books.")

    assert (result.status, result.text, result.turns) == (pb.STATUS_DONE, "balanced", 2)
    first, second = anthropic.requests
    for body in (first, second):
        # Three breakpoints, within the API's four: the last tool, the system prompt, the conversation's tail.
        assert breakpoints(body) == [EPHEMERAL] * 3
        assert body["tools"][-1]["cache_control"] == EPHEMERAL
        assert all("cache_control" not in tool for tool in body["tools"][:-1])
        assert body["system"] == [{"type": "text", "text": INSTRUCTIONS, "cache_control": EPHEMERAL}]
        assert body["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL
    assert first["messages"][-1]["content"] == [{"type": "text", "text": "Balance the books.", "cache_control": EPHEMERAL}]
    tail = second["messages"][-1]["content"][-1]
    assert (tail["type"], tail["content"], tail["cache_control"]) == ("tool_result", "ping ok #1", EPHEMERAL)
    # The second turn's request starts with the first turn's conversation, block for block:
    # the prefix the first turn wrote is the one the second reads.
    assert unmarked(second["messages"])[: len(first["messages"])] == unmarked(first["messages"])
    assert unmarked(second["messages"])[0]["content"][0] == {"type": "text", "text": "Balance the books."}

    own = result.own_usage
    assert (own.input_tokens, own.cache_read_tokens, own.cache_write_tokens, own.output_tokens, own.reasoning_tokens) == (
        12 + 9,
        1800,
        1800 + 64,
        30 + 21,
        0,
    )
    assert own.total_tokens == result.own_tokens == 12 + 1800 + 30 + 9 + 64 + 1800 + 21
    assert result.total_usage == own and not own.estimated


async def test_anthropic_without_prompt_cache_sends_no_breakpoint(
    stub: pb_grpc.AgentRuntimeAsyncStub, anthropic: ScriptedAnthropicServer, tools: ToolServer
) -> None:
    anthropic.script("claude-test", lambda body: Turn(text="done") if anthropic_results(body) else Turn(calls=[("ping", {})]))
    runtime_id = await create(stub, ledger("keeper", tools))

    _, result = await run(stub, runtime_id, "keeper", "Balance the books.")

    assert (result.status, result.turns) == (pb.STATUS_DONE, 2)
    for body in anthropic.requests:
        assert "cache_control" not in json.dumps(body)
        assert isinstance(body["system"], str)


# ---- openai ------------------------------------------------------------------------------


def cached_turns(body: dict[str, Any]) -> Reply:
    """A tool call, then an answer whose prompt was mostly read from the cache."""
    if tool_results(body) == 0:
        return Reply(calls=[("ping", {})], usage=CompletionUsage(prompt_tokens=1500, completion_tokens=40, total_tokens=1540))
    details = PromptTokensDetails(cached_tokens=1408)
    usage = CompletionUsage(prompt_tokens=1570, completion_tokens=25, total_tokens=1595, prompt_tokens_details=details)
    return Reply(text=f"done: {last_user(body)}", usage=usage)


async def test_openai_sends_one_prompt_cache_key_per_handle_and_reads_cached_tokens(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    model.script("gpt-test", cached_turns)
    ping = http_tool("ping", tools.url("ping"))
    runtime_id = await create(
        stub,
        agent("cached", model="gpt-test", instructions=INSTRUCTIONS, tools=[ping], prompt_cache=True),
        agent("plain", model="gpt-test", instructions=INSTRUCTIONS, tools=[ping]),
    )

    first_id, first = await run(stub, runtime_id, "cached", "one")
    second_id, second = await run(stub, runtime_id, "cached", "two")
    assert second_id != first_id
    _, plain = await run(stub, runtime_id, "plain", "three")

    assert [r.status for r in (first, second, plain)] == [pb.STATUS_DONE] * 3
    by_prompt = {prompt: [body for body in model.requests if last_user(body) == prompt] for prompt in ("one", "two", "three")}
    assert [len(bodies) for bodies in by_prompt.values()] == [2, 2, 2]
    one = {body["prompt_cache_key"] for body in by_prompt["one"]}
    two = {body["prompt_cache_key"] for body in by_prompt["two"]}
    assert len(one) == len(two) == 1 and one != two  # the same key on both turns; another handle, another key
    key = one.pop()
    assert first_id not in key and runtime_id not in key and len(key) == 32  # a digest: no id reaches the provider
    assert all("prompt_cache_key" not in body for body in by_prompt["three"])

    for result in (first, second, plain):
        own = result.own_usage
        assert (own.input_tokens, own.cache_read_tokens, own.cache_write_tokens, own.output_tokens, own.reasoning_tokens) == (
            1500 + 1570 - 1408,
            1408,
            0,
            40 + 25,
            0,
        )
        assert own.total_tokens == result.total_tokens == 1540 + 1595
