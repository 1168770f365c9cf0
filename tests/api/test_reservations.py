"""Reservations (docs/budgets.md#reservations): before a model turn starts, its input's estimate
and its output cap, at the model's price, are held against every max_tokens and max_cost of its
lineage and against its tenant's quotas; a turn that does not fit does not start. A lead fans
out to 30 children replying at once (over a scripted OpenAI-shaped server, with prices): the
budget or quota holds, where before every child's turn started and passed it many times over.
Anthropic's default cap is reserved as the cap it is; a reservation is released when its turn
fails or is interrupted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from openai.types import CompletionUsage

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.build import agent, create, run, spawn, struct, views, wait
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.servers import Served, serve

CHILDREN = 30
CAP = 100  # the children's max_output_tokens: what a reply may bill as output, at most
# Micro-units per token (a price per million tokens). Cache writes are the dearest input: the
# reservation prices its input estimate at them.
PRICES = {"input": 2.5, "cache_read": 0.25, "cache_write": 3.125, "output": 10}
# What each child's reply bills, the worst its cap allows: 10 x 2.5 + 100 x 10 = 1025 micros.
CHILD_USAGE = CompletionUsage(prompt_tokens=10, completion_tokens=CAP, total_tokens=10 + CAP)
CHILD_COST = 1025


def fan_out(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("task", {"agent": "w", "prompt": f"part {n}"}) for n in range(CHILDREN)], tokens=20)
    return Reply(text="gathered", tokens=20)


@pytest.fixture
async def served(tmp_path: Path, model: ScriptedModelServer, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    prices = tmp_path / "prices.json"
    entries = [{"provider": "openai", "model": name, **PRICES} for name in ("lead", "w")]
    prices.write_text(json.dumps({"currency": "USD", "prices": entries}))
    settings = getattr(request, "param", {})
    async with serve(llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", prices=str(prices), **settings) as s:
        yield s


async def fan_out_run(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, lead_budget: pb.Budget) -> pb.TaskResult:
    """The lead's 30 task calls start 30 children at once; each child's one turn takes a while,
    so every turn that starts is under way at once."""
    model.script("lead", fan_out)
    model.script("w", lambda body: Reply(text="part done", usage=CHILD_USAGE, delay=0.5))
    runtime_id = await create(stub, agent("lead", team=["w"], budget=lead_budget), agent("w", max_output_tokens=CAP))
    handle_id, result = await run(stub, runtime_id, "lead", "split the work")
    children = [view for key, view in (await views(stub, runtime_id)).items() if key != handle_id]
    assert len(children) == CHILDREN
    assert result.total_tokens == result.own_tokens + sum(child.total_tokens for child in children)
    assert result.total_cost.micros == result.own_cost.micros + sum(child.total_cost.micros for child in children)
    return result


@pytest.mark.parametrize(
    ("budget", "figure"),
    [
        (pb.Budget(max_cost=6_000), lambda result: result.total_cost.micros),
        (pb.Budget(max_tokens=700), lambda result: result.total_tokens),
    ],
    ids=["max_cost", "max_tokens"],
)
async def test_thirty_children_replying_at_once_keep_within_their_parents_budget(
    served: Served, model: ScriptedModelServer, budget: pb.Budget, figure: Any
) -> None:
    result = await fan_out_run(served.stub, model, budget)
    cap = budget.max_cost or budget.max_tokens
    # Before reservations all 30 turns started (30 x 1025 micros, 30 x 110 tokens): 5 and 4.7
    # times the budget. Each reply bills no more than its reservation here, so none is passed.
    assert figure(result) <= cap, result
    started = model.calls["w"]
    assert 0 < started < CHILDREN
    assert result.status == pb.STATUS_INCOMPLETE and result.limit in (pb.LIMIT_MAX_COST, pb.LIMIT_MAX_TOKENS), result


async def test_children_refused_a_reservation_stop_saying_so_and_call_no_model(
    served: Served, model: ScriptedModelServer
) -> None:
    model.script("lead", fan_out)
    model.script("w", lambda body: Reply(text="part done", usage=CHILD_USAGE, delay=0.5))
    runtime_id = await create(
        served.stub, agent("lead", team=["w"], budget=pb.Budget(max_cost=6_000)), agent("w", max_output_tokens=CAP)
    )
    handle_id, _ = await run(served.stub, runtime_id, "lead", "split the work")
    children = [view for key, view in (await views(served.stub, runtime_id)).items() if key != handle_id]
    refused = [child for child in children if child.turns == 0]
    assert len(refused) == CHILDREN - model.calls["w"] > 0
    for child in refused:
        result = await wait(served.stub, runtime_id, child.handle_id)
        assert (result.status, result.limit, result.total_cost.micros) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_COST, 0)
        assert "the next turn is reserved" in result.text and f"its output cap of {CAP} tokens" in result.text
        assert f"{handle_id}'s max_cost of 6,000" in result.text


@pytest.mark.parametrize("served", [{"quota_cost_per_day": 6_000}], indirect=True)
async def test_thirty_children_replying_at_once_keep_within_the_tenants_cost_quota(
    served: Served, model: ScriptedModelServer
) -> None:
    result = await fan_out_run(served.stub, model, pb.Budget())
    # Before reservations the quota was passed five times over in this one run.
    assert result.total_cost.micros <= 6_000, result
    assert 0 < model.calls["w"] < CHILDREN
    runtimes = (await served.stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes
    assert [runtime.total_cost.micros for runtime in runtimes] == [result.total_cost.micros]
    # The children refused stopped on the quota, naming it.
    listed = await views(served.stub, runtimes[0].runtime_id)
    stopped = [view for view in listed.values() if view.turns == 0]
    assert stopped and all(view.last_status == pb.STATUS_INCOMPLETE for view in stopped)


async def test_anthropics_default_output_cap_is_reserved(anthropic: ScriptedAnthropicServer, tmp_path: Path) -> None:
    """Anthropic requires a cap: unset on the agent, the provider's max_output_tokens (4096) is
    sent, and reserved: 4096 x 10 micros does not fit a max_cost of 10,000, so no call is made.
    With the agent's own cap of 100 the same turn fits."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"currency": "USD", "prices": [{"provider": "anthropic", "model": "claude", **PRICES}]}))
    anthropic.script("claude", lambda body: Turn(text="ok", input_tokens=10, output_tokens=5))
    providers = {"anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": "sk-ant-test"}}
    async with serve(providers=providers, prices=str(prices)) as served:
        budget = pb.Budget(max_cost=10_000)
        runtime_id = await create(
            served.stub,
            agent("uncapped", model="claude", provider="anthropic", budget=budget),
            agent("capped", model="claude", provider="anthropic", budget=budget, max_output_tokens=100),
        )
        _, stopped = await run(served.stub, runtime_id, "uncapped", "go")
        assert (stopped.status, stopped.limit, stopped.turns) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_COST, 0), stopped
        assert "its output cap of 4,096 tokens" in stopped.text
        assert anthropic.calls["claude"] == 0
        _, done = await run(served.stub, runtime_id, "capped", "go")
        assert (done.status, done.own_cost.micros) == (pb.STATUS_DONE, 10 * 2.5 + 5 * 10), done
        assert [body["max_tokens"] for body in anthropic.requests] == [100]


async def test_a_turn_that_fails_or_is_interrupted_gives_its_reservation_back(served: Served, model: ScriptedModelServer) -> None:
    """The budget holds one turn's reservation, not two: were a failed or an interrupted turn's
    reservation kept, the next turn would never start."""
    replies = iter(
        [
            Reply(status=400, raw='{"error": {"message": "bad request"}}'),
            Reply(text="slow", tokens=10, delay=30.0),
            Reply(text="done", tokens=10),
        ]
    )
    model.script("solo", lambda body: next(replies))
    runtime_id = await create(served.stub, agent("solo", max_output_tokens=CAP, budget=pb.Budget(max_tokens=250)))
    handle_id = await spawn(served.stub, runtime_id, "solo")

    async def wake_and_wait(prompt: str) -> pb.TaskResult:
        await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=prompt))
        return await wait(served.stub, runtime_id, handle_id)

    failed = await wake_and_wait("one")
    assert failed.status == pb.STATUS_ERROR and failed.failure.reason == pb.FAILURE_REASON_PROVIDER_BAD_REQUEST, failed
    await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="two"))
    await until(lambda: model.calls["solo"] == 2, "the slow turn under way")
    await served.stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))
    interrupted = await wait(served.stub, runtime_id, handle_id)
    assert interrupted.status == pb.STATUS_INTERRUPTED
    done = await wake_and_wait("three")
    assert (done.status, done.text, done.own_tokens) == (pb.STATUS_DONE, "done", 10), done
    assert model.calls["solo"] == 3


async def test_a_budget_that_asks_asks_when_the_next_turns_reservation_does_not_fit(
    served: Served, model: ScriptedModelServer
) -> None:
    model.script("asker", lambda body: Reply(text="answered", tokens=20))
    budget = pb.Budget(max_tokens=50, on_exhausted=pb.ON_EXHAUSTED_ASK)
    runtime_id = await create(served.stub, agent("asker", max_output_tokens=CAP, budget=budget))
    _, asked = await run(served.stub, runtime_id, "asker", "go")
    assert (asked.status, asked.pending.kind) == (pb.STATUS_PENDING, "budget"), asked
    data = asked.pending.data
    assert (data["limit"], data["used"], data["budget"]) == ("LIMIT_MAX_TOKENS", 0, 50)
    assert data["reserved"] > CAP and "cannot start its next turn" in asked.pending.prompt
    assert model.calls["asker"] == 0
    answer = pb.Answer(id=asked.pending.id, ok=True, data=struct({"extend": {"max_tokens": 1000}}))
    done = (await served.stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
    assert (done.status, done.text, done.own_tokens) == (pb.STATUS_DONE, "answered", 20), done
