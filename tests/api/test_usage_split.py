"""Usage split as the providers bill it, from replies built with the SDKs' own usage types
(openai's `CompletionUsage` with its details, anthropic's `Usage` with its cache fields),
through a real server: a lead on OpenAI delegating to a worker on Anthropic that suspends on a
relay tool, over a restart on the same SQLite store and a Resume. Every figure is exact, and
the invariants hold field by field at every read: a parent's total is its own plus its
child's total, `total_tokens` is `total_usage.total_tokens`, reasoning counts inside output."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from anthropic.types import OutputTokensDetails
from anthropic.types import Usage as AnthropicUsage
from openai.types import CompletionUsage
from openai.types.completion_usage import CompletionTokensDetails, PromptTokensDetails

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.anthropic_server import tool_results as anthropic_results
from tests.support.build import agent, create, spawn, views
from tests.support.calls import resume, until_state, wake
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.scripts import relay_answer, relay_tool
from tests.support.servers import serve

Split = tuple[int, int, int, int, int]  # input, cache reads, cache writes, output, reasoning

# The lead's two chat completions: prompt_tokens less cached_tokens is input, cached_tokens cache
# reads, completion_tokens output with reasoning_tokens inside it.
LEAD_1 = CompletionUsage(
    prompt_tokens=120,
    completion_tokens=30,
    total_tokens=150,
    prompt_tokens_details=PromptTokensDetails(cached_tokens=80),
    completion_tokens_details=CompletionTokensDetails(reasoning_tokens=12),
)
LEAD_2 = CompletionUsage(
    prompt_tokens=260,
    completion_tokens=18,
    total_tokens=278,
    prompt_tokens_details=PromptTokensDetails(cached_tokens=150),
    completion_tokens_details=CompletionTokensDetails(reasoning_tokens=5),
)
# The worker's two messages: the first writes the cache, the second reads it.
WORKER_1 = AnthropicUsage(
    input_tokens=50,
    cache_creation_input_tokens=300,
    cache_read_input_tokens=0,
    output_tokens=25,
    output_tokens_details=OutputTokensDetails(thinking_tokens=10),
)
WORKER_2 = AnthropicUsage(input_tokens=7, cache_creation_input_tokens=40, cache_read_input_tokens=300, output_tokens=11)

L1: Split = (40, 80, 0, 30, 12)
L2: Split = (110, 150, 0, 18, 5)
W1: Split = (50, 0, 300, 25, 10)
W2: Split = (7, 300, 40, 11, 0)


def plus(*splits: Split) -> Split:
    return tuple(sum(figures) for figures in zip(*splits, strict=True))


def split(usage: pb.Usage) -> Split:
    assert not usage.estimated
    assert usage.total_tokens == usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens + usage.output_tokens
    assert usage.reasoning_tokens <= usage.output_tokens  # reasoning counted inside output, never added
    return (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens, usage.output_tokens, usage.reasoning_tokens)


def holds_the_invariants(lead: pb.HandleView | pb.TaskResult, worker: pb.HandleView | pb.TaskResult) -> None:
    assert split(lead.total_usage) == plus(split(lead.own_usage), split(worker.total_usage))
    assert split(worker.total_usage) == split(worker.own_usage)  # the worker has no children
    for figures in (lead, worker):
        assert figures.total_tokens == figures.total_usage.total_tokens
        assert figures.own_tokens == figures.own_usage.total_tokens


def lead_script(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("task", {"agent": "worker", "prompt": "audit the ledger"})], usage=LEAD_1)
    return Reply(text="signed off", usage=LEAD_2)


def worker_script(body: dict[str, Any]) -> Turn:
    if not anthropic_results(body):
        return Turn(calls=[("approve", {})], usage=WORKER_1)
    return Turn(text="audited", usage=WORKER_2)


@asynccontextmanager
async def serving(
    tmp_path: Path, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    providers = {"anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": "sk-ant-test"}}
    async with serve(
        llm_style="openai",
        llm_base_url=model.base_url,
        llm_api_key="sk-test",
        providers=providers,
        store=f"sqlite:///{tmp_path / 'store.db'}",
    ) as served:
        yield served.stub


async def both(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, lead_id: str) -> tuple[pb.HandleView, pb.HandleView]:
    listed = await views(stub, runtime_id)
    return listed[lead_id], listed[f"{lead_id}/worker.1"]


async def suspend_the_worker(stub: pb_grpc.AgentRuntimeAsyncStub) -> tuple[str, str, pb.TaskResult]:
    """The lead delegates, the worker asks for approval: the split so far, exact."""
    runtime_id = await create(
        stub,
        agent("lead", team=["worker"]),
        agent("worker", model="claude-test", provider="anthropic", tools=[relay_tool("approve")]),
    )
    lead_id = await spawn(stub, runtime_id, "lead")
    worker_id = f"{lead_id}/worker.1"
    await wake(stub, runtime_id, lead_id, "Close the quarter.")
    await until_state(stub, runtime_id, worker_id, pb.HANDLE_STATE_SUSPENDED)
    suspended = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=worker_id), timeout=60)).result
    assert suspended.status == pb.STATUS_PENDING
    assert (split(suspended.own_usage), split(suspended.total_usage)) == (W1, W1)
    lead, worker = await both(stub, runtime_id, lead_id)
    assert (split(lead.own_usage), split(lead.total_usage)) == (L1, plus(L1, W1))
    assert split(worker.own_usage) == W1
    holds_the_invariants(lead, worker)
    return runtime_id, lead_id, suspended


async def settled(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, lead_id: str) -> tuple[pb.TaskResult, pb.TaskResult]:
    """Both results once the tree is done: every reply counted once, where it belongs."""
    finished = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=lead_id), timeout=60)).result
    done = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=f"{lead_id}/worker.1"), timeout=60)).result
    assert (finished.status, finished.text, done.status, done.text) == (pb.STATUS_DONE, "signed off", pb.STATUS_DONE, "audited")
    assert (split(done.own_usage), split(done.total_usage)) == (plus(W1, W2), plus(W1, W2))
    assert split(finished.own_usage) == plus(L1, L2) == (150, 230, 0, 48, 17)
    assert split(finished.total_usage) == plus(L1, L2, W1, W2) == (207, 530, 340, 84, 27)
    assert finished.total_tokens == 150 + 278 + 375 + 358
    holds_the_invariants(finished, done)
    lead, worker = await both(stub, runtime_id, lead_id)
    assert (lead.own_usage, lead.total_usage, worker.own_usage, worker.total_usage) == (
        finished.own_usage,
        finished.total_usage,
        done.own_usage,
        done.total_usage,
    )
    holds_the_invariants(lead, worker)
    return finished, done


async def test_the_split_through_a_delegating_tree_over_a_restart_and_a_resume(
    tmp_path: Path, model: ScriptedModelServer, anthropic: ScriptedAnthropicServer
) -> None:
    model.script("lead", lead_script)
    anthropic.script("claude-test", worker_script)
    async with serving(tmp_path, model, anthropic) as stub:
        runtime_id, lead_id, suspended = await suspend_the_worker(stub)
        before_restart = await both(stub, runtime_id, lead_id)

    async with serving(tmp_path, model, anthropic) as stub:  # the same store: the journal replays the split
        lead, worker = await both(stub, runtime_id, lead_id)
        for was, now in zip(before_restart, (lead, worker), strict=True):
            assert (now.own_usage, now.total_usage, now.own_tokens, now.total_tokens) == (
                was.own_usage,
                was.total_usage,
                was.own_tokens,
                was.total_tokens,
            )
        holds_the_invariants(lead, worker)

        first = await resume(stub, runtime_id, relay_answer(suspended.pending, "approved"))
        finished, done = await settled(stub, runtime_id, lead_id)
        assert first == finished
        assert (model.calls["lead"], anthropic.calls["claude-test"]) == (2, 2)  # nothing bought twice

    async with serving(tmp_path, model, anthropic) as stub:  # and once more, settled: nothing moves
        assert await settled(stub, runtime_id, lead_id) == (finished, done)
