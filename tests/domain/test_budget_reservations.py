"""Reservations (runs/reservations.py, docs/budgets.md#reservations) in a running runtime: before
a model turn starts, its input's estimate and its output cap, at the model's price, are held
against every max_tokens and max_cost of its lineage and the tenant's quotas; a turn starts
only if that fits, and its hold is released when its reply is journaled, or when it fails, is
interrupted or is cut by its wall time. Agents here run on the planned model (kit_turns.py),
which tells its output cap as a provider does: the embedded scripted model reserves nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from agentruntime_server.domain.billing.usage import Tokens
from agentruntime_server.domain.limits import Quotas
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import Budget, Limit, OnExhausted, ReplyStop, Status, TaskResult

from tests.domain.harness import Bench, agent, http_tool, reply
from tests.domain.kit_turns import NEVER_HANGS, PLANNED, Benches, PlannedModel, price, prices

pytestmark = NEVER_HANGS

CHILDREN = 30
CAP = 100  # the children's max_output_tokens: what a reply may bill as output, at most
# Micro-units per token. Cache writes are the dearest input: a reservation prices its input at them.
PRICES = prices(*(price(PLANNED, name, "2.5", "0.25", "3.125", "10") for name in ("lead", "w")))
# What each child's reply bills, the worst its cap allows: 10 x 2.5 + 100 x 10 = 1025 micros.
CHILD_USAGE = Tokens(input=10, output=CAP)


async def fan_out(bench: Bench, model: PlannedModel, lead_budget: Budget) -> tuple[Runtime, TaskResult]:
    """The lead's 30 task calls start 30 children at once; each child's one turn takes 5 s, so
    every turn that starts is under way with the others."""
    calls = tuple(("task", {"agent": "w", "prompt": f"part {n}"}) for n in range(CHILDREN))
    model.plan("lead", reply(calls=calls, tokens=20), reply("gathered", tokens=20))
    model.plan("w", reply("part done", tokens=0, usage=CHILD_USAGE, delay=5))
    runtime = await bench.create(agent("lead", team=("w",), model="lead"), agent("w", model="w", max_output_tokens=CAP))
    handle_id = await bench.spawn(runtime, "lead", budget=lead_budget)
    await runtime.wake(handle_id, "split the work")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await bench.clock.advance(5)
    assert waiting.done()  # settled by then: a run still waiting fails here, not hangs
    result = await waiting
    assert len(runtime.handle(handle_id).children) == CHILDREN
    assert model.peak == model.calls["w"]  # the children's turns that started were all under way at once
    return runtime, result


@pytest.mark.parametrize(
    ("budget", "figure"),
    [
        (Budget(max_cost=6_000), lambda result: result.usage.total_cost.micros),
        (Budget(max_tokens=700), lambda result: result.usage.total_tokens),
    ],
    ids=["max_cost", "max_tokens"],
)
async def test_thirty_children_replying_at_once_keep_within_their_parents_budget(
    benches: Benches, budget: Budget, figure: Callable[[TaskResult], int]
) -> None:
    bench, model = await benches.planned(PRICES)
    _, result = await fan_out(bench, model, budget)
    # Unreserved, all 30 turns would start (30 x 1025 micros, 30 x 110 tokens): 5 and 4.7 times
    # the budget. Each reply bills no more than its reservation here, so none is passed.
    assert figure(result) <= (budget.max_cost or budget.max_tokens or 0), result
    assert 0 < model.calls["w"] < CHILDREN
    assert result.status is Status.INCOMPLETE and result.limit in (Limit.MAX_COST, Limit.MAX_TOKENS), result


async def test_children_refused_a_reservation_stop_saying_so_and_call_no_model(benches: Benches) -> None:
    bench, model = await benches.planned(PRICES)
    runtime, result = await fan_out(bench, model, Budget(max_cost=6_000))
    refused = [child for child in runtime.handle(result.handle_id).children if child.usage.turns == 0]
    assert len(refused) == CHILDREN - model.calls["w"] > 0
    for child in refused:
        stopped = runtime.settled_result(child)
        assert (stopped.status, stopped.limit, stopped.usage.total_cost.micros) == (Status.INCOMPLETE, Limit.MAX_COST, 0)
        assert "the next turn is reserved" in stopped.text and f"its output cap of {CAP} tokens" in stopped.text
        assert f"{result.handle_id}'s max_cost of 6,000" in stopped.text


async def test_thirty_children_replying_at_once_keep_within_the_tenants_cost_quota(benches: Benches) -> None:
    bench, model = await benches.planned(PRICES, quotas=Quotas(cost_per_day=6_000))
    runtime, result = await fan_out(bench, model, Budget())
    assert result.usage.total_cost.micros <= 6_000, result
    assert 0 < model.calls["w"] < CHILDREN
    stopped = [child for child in runtime.handle(result.handle_id).children if child.usage.turns == 0]
    assert stopped and all(runtime.settled_result(child).status is Status.INCOMPLETE for child in stopped)


async def test_a_turn_starts_only_if_its_reservation_fits_to_the_token(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("solo", reply("answered", tokens=20))
    runtime = await bench.create(agent("solo", max_output_tokens=CAP), agent("wider", max_output_tokens=2 * CAP))
    model.plan("wider", reply("answered", tokens=20))
    asked = await bench.run(runtime, "solo", "go", budget=Budget(max_tokens=1, on_exhausted=OnExhausted.ASK))
    assert asked.pending is not None
    reserved = asked.pending.data["reserved"]
    wider = await bench.run(runtime, "wider", "go", budget=Budget(max_tokens=1, on_exhausted=OnExhausted.ASK))
    assert wider.pending is not None and wider.pending.data["reserved"] - reserved == CAP  # the output cap, reserved whole
    short = await bench.run(runtime, "solo", "go", budget=Budget(max_tokens=reserved - 1))
    assert (short.status, short.limit, short.usage.turns, model.calls["solo"]) == (Status.INCOMPLETE, Limit.MAX_TOKENS, 0, 0)
    assert short.text.startswith(f"stopped at LIMIT_MAX_TOKENS: the next turn is reserved {reserved} tokens")
    exact = await bench.run(runtime, "solo", "go", budget=Budget(max_tokens=reserved))
    assert (exact.status, exact.text, model.calls["solo"]) == (Status.DONE, "answered", 1)


async def test_a_turn_under_way_holds_its_reservation_on_its_lineage_until_its_reply(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("lead", reply(calls=(("task", {"agent": "w", "prompt": "dig"}),)), reply("done"))
    model.plan("w", reply("dug", tokens=30, delay=10))
    runtime = await bench.create(agent("lead", team=("w",)), agent("w", max_output_tokens=CAP))
    handle_id = await bench.spawn(runtime, "lead", budget=Budget(max_tokens=10_000))
    await runtime.wake(handle_id, "go")
    await bench.clock.advance(5)
    lead = runtime.handle(handle_id)
    [child] = lead.children
    assert model.in_flight == 1 and child.held_tokens > CAP  # its input's estimate and its cap
    assert lead.held_tokens == child.held_tokens  # the lead's own turn replied: only the child's is held
    await bench.clock.advance(5)
    result = await runtime.wait(handle_id, None)
    assert result.status is Status.DONE and (lead.held_tokens, child.held_tokens) == (0, 0)
    assert (lead.held_micros, child.held_micros) == (0, 0)


async def test_a_scripted_turn_reserves_nothing(bench: Bench) -> None:
    runtime = await bench.create(agent("solo", reply("late", tokens=30, delay=10), max_output_tokens=CAP))
    handle_id = await bench.spawn(runtime, "solo", budget=Budget(max_tokens=5))
    await runtime.wake(handle_id, "go")
    await bench.clock.advance(5)
    assert runtime.handle(handle_id).held_tokens == 0  # its figures are its script's, not a request's
    await bench.clock.advance(5)
    assert (await runtime.wait(handle_id, None)).usage.own_tokens == 30


async def test_a_turn_that_fails_is_cut_or_is_interrupted_gives_its_reservation_back(benches: Benches) -> None:
    """Room for one turn's reservation, not two: were a reservation kept by a turn that ended
    without a reply, the next turn would never start."""
    bench, model = await benches.planned()
    model.plan(
        "solo",
        reply(stop=ReplyStop.PROVIDER_UNAVAILABLE),
        reply("cut", delay=60),  # past the run's wall time
        reply("interrupted", delay=60),
        reply("done", tokens=10),
        by_call=True,
    )
    runtime = await bench.create(agent("solo", max_output_tokens=CAP))
    asked = await bench.run(runtime, "solo", "size", budget=Budget(max_tokens=1, on_exhausted=OnExhausted.ASK))
    assert asked.pending is not None
    room = asked.pending.data["reserved"] * 2 - 1  # the prompts below are as long as "size"
    handle_id = await bench.spawn(runtime, "solo", budget=Budget(max_tokens=room, max_wall_time=30))
    handle = runtime.handle(handle_id)

    async def wake(prompt: str, then: float = 0.0, interrupt: bool = False) -> TaskResult:
        await runtime.wake(handle_id, prompt)
        if then:
            await bench.clock.advance(then - 1)
            assert handle.held_tokens > 0  # the turn under way holds it
            if interrupt:
                await runtime.interrupt(handle_id)
            else:
                await bench.clock.advance(1)
        settled: TaskResult = await runtime.wait(handle_id, None)
        return settled

    failed = await wake("one!")
    assert (failed.status, handle.held_tokens) == (Status.ERROR, 0)
    cut = await wake("two!", then=30)
    assert (cut.status, cut.limit, handle.held_tokens) == (Status.INCOMPLETE, Limit.MAX_WALL_TIME, 0)
    interrupted = await wake("tri!", then=10, interrupt=True)
    assert (interrupted.status, handle.held_tokens) == (Status.INTERRUPTED, 0)
    done = await wake("for!")
    assert (done.status, done.text, done.usage.own_tokens) == (Status.DONE, "done", 10)
    assert model.calls["solo"] == 4


async def test_a_budget_that_asks_asks_when_the_next_turns_reservation_does_not_fit(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("asker", reply("answered", tokens=20))
    runtime = await bench.create(agent("asker", max_output_tokens=CAP))
    asked = await bench.run(runtime, "asker", "go", budget=Budget(max_tokens=50, on_exhausted=OnExhausted.ASK))
    assert asked.pending is not None and (asked.status, asked.pending.kind) == (Status.PENDING, "budget")
    data = asked.pending.data
    assert (data["limit"], data["used"], data["budget"]) == ("LIMIT_MAX_TOKENS", 0, 50)
    assert data["reserved"] > CAP and "cannot start its next turn" in asked.pending.prompt
    assert model.calls["asker"] == 0
    done = await bench.resume(runtime, asked, data={"extend": {"max_tokens": 1000}})
    assert (done.status, done.text, done.usage.own_tokens) == (Status.DONE, "answered", 20)


async def test_a_token_budget_stops_a_run_on_estimated_usage(benches: Benches) -> None:
    """A provider that reports no usage: its turns are estimated, and count as spent."""
    bench, model = await benches.planned()
    model.plan("lead", reply(calls=(("ping", {}),)))
    model.unreported.add("lead")
    runtime = await bench.create(agent("lead", tools=(http_tool("ping"),)))
    result = await bench.run(runtime, "lead", "Ping until you are told to stop, please. " * 10, budget=Budget(max_tokens=200))
    # The first turn's reservation (its input, about 150 tokens: no output cap) fits; the second's
    # does not fit beside the first's estimated usage (counted as 0, it would).
    assert (result.status, result.limit, model.calls["lead"]) == (Status.INCOMPLETE, Limit.MAX_TOKENS, 1), result
    assert result.usage.own_estimated and result.usage.own_tokens >= 100


async def test_a_child_that_asks_stops_when_its_next_turn_fits_neither_its_budget_nor_its_parents(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("lead", reply(calls=(("task", {"agent": "w", "prompt": "go"}),), tokens=10), reply("done", tokens=10))
    model.plan("w", reply(calls=(("ping", {}),), tokens=130))
    worker = agent("w", tools=(http_tool("ping"),), budget=Budget(on_exhausted=OnExhausted.ASK))
    runtime = await bench.create(agent("lead", team=("w",)), worker)
    result = await bench.run(runtime, "lead", "go", budget=Budget(max_tokens=300))
    [child] = runtime.handle(result.handle_id).children
    # Carved the lead's 290 left. After two turns (260) its third, reserved its input's estimate
    # (more than the 30 left), fits neither its budget nor the lead's, and any extension of its
    # own would be capped by the lead's: it stops instead of asking.
    assert (child.budget.max_tokens, child.usage.total_tokens, child.usage.turns) == (290, 260, 2)
    assert (child.pending, runtime.settled_result(child).status) == (None, Status.INCOMPLETE)
    assert (result.status, result.limit) == (Status.INCOMPLETE, Limit.MAX_TOKENS), result
    assert result.usage.total_tokens == result.usage.own_tokens + child.usage.total_tokens == 270
