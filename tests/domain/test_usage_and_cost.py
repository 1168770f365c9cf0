"""Usage and cost in a running runtime (billing/, docs/usage.md): each reply's tokens as the
provider bills them (input, cache reads, cache writes, output with reasoning inside it), priced
from the price table in force when it comes, rounded once; a handle's own figures and its
subtree's totals, where a parent's total is its own plus its children's totals at every read,
whatever the status; figures that never go down, not even when a run is rolled back; a reply
whose usage is absurd never counted; usage estimated when a provider reports none."""

from __future__ import annotations

from typing import Any

import pytest
from agentruntime_server.domain.billing.usage import NO_TOKENS, Cost, Tokens
from agentruntime_server.domain.journal import Tree, replay
from agentruntime_server.domain.journal.events import Event, EventKind
from agentruntime_server.domain.limits import MAX_REPLY_TOKENS, Quotas
from agentruntime_server.domain.vocabulary import (
    Answer,
    Budget,
    CompletionGate,
    FailureReason,
    RelayExecutor,
    ReplyStop,
    ScriptedReply,
    Status,
    ToolOutput,
    ToolSpec,
)

from tests.domain.harness import Bench, agent, http_tool, reply
from tests.domain.kit_turns import (
    NEVER_HANGS,
    Benches,
    Figures,
    SwitchablePrices,
    Watcher,
    assert_tree_rule,
    price,
    prices,
)

pytestmark = NEVER_HANGS

# The lead's two replies and the worker's two (the first writes a cache, the second reads it):
# input at the base rate, cache reads, cache writes, output, reasoning (inside output).
L1 = Tokens(40, 80, 0, 30, 12)
L2 = Tokens(110, 150, 0, 18, 5)
W1 = Tokens(50, 0, 300, 25, 10)
W2 = Tokens(7, 300, 40, 11, 0)
SPLIT = Tokens(input=1001, cache_read=3, cache_write=1, output=77, reasoning=20)
# 1001 x 2.5 + 3 x 0.25 + 1 x 3.125 + 77 x 10 = 3276.375: 3276 micros (reasoning is inside output).
FIRST = 3276
# The same reply once output costs 20: 4046.375: 4046.
SECOND = 4046


def billed(text: str = "", usage: Tokens = NO_TOKENS, **fields: Any) -> ScriptedReply:
    made: ScriptedReply = reply(text, tokens=0, usage=usage, **fields)
    return made


def plus(*splits: Tokens) -> Tokens:
    total = Tokens()
    for split in splits:
        total = total.plus(split)
    return total


def priced_table(output: str = "10") -> Any:
    return prices(price("scripted", "priced-*", "2.5", "0.25", "3.125", output))


# ---- the split ------------------------------------------------------------------------------


async def test_the_split_through_a_delegating_tree_over_a_resume_is_exact_at_every_read(bench: Bench) -> None:
    approve = ToolSpec("approve", "the host approves", {"type": "object"}, RelayExecutor())
    lead = agent(
        "lead",
        billed(calls=(("task", {"agent": "worker", "prompt": "audit"}),), usage=L1),
        billed("signed off", L2),
        team=("worker",),
    )
    worker = agent("worker", billed(calls=(("approve", {}),), usage=W1), billed("audited", W2), tools=(approve,))
    runtime = await bench.create(lead, worker)
    suspended = await bench.run(runtime, "lead", "Close the quarter.")
    assert suspended.status is Status.PENDING and suspended.pending is not None
    lead_handle = runtime.handle(suspended.handle_id)
    [worker_handle] = lead_handle.children
    assert (worker_handle.usage.own_split, worker_handle.usage.total_split) == (W1, W1)
    assert (lead_handle.usage.own_split, lead_handle.usage.total_split) == (L1, plus(L1, W1))
    assert suspended.usage == lead_handle.usage
    assert_tree_rule(runtime)

    [(call, _)] = suspended.pending.calls
    finished = await runtime.resume(Answer(suspended.pending.id, ok=True, outputs=(ToolOutput(call.id, "approved"),)))
    assert (finished.status, finished.text) == (Status.DONE, "signed off")
    assert (worker_handle.usage.own_split, worker_handle.usage.total_split) == (plus(W1, W2), plus(W1, W2))
    assert finished.usage.own_split == plus(L1, L2) == Tokens(150, 230, 0, 48, 17)
    assert finished.usage.total_split == plus(L1, L2, W1, W2) == Tokens(207, 530, 340, 84, 27)
    assert finished.usage.total_tokens == 150 + 278 + 375 + 358  # each reply's total: reasoning is not added again
    assert finished.usage == lead_handle.usage
    assert_tree_rule(runtime)


async def test_the_tree_rule_holds_on_every_status(bench: Bench) -> None:
    calls = tuple(("task", {"agent": name, "prompt": "go"}) for name in ("ok", "cut", "failing", "looper"))
    lead = agent(
        "lead",
        reply(calls=calls, tokens=11),
        reply(calls=(("ask", {"question": "ship it?"}),), tokens=13),
        reply("shipped", tokens=17),
        team=("ok", "cut", "failing", "looper"),
    )
    runtime = await bench.create(
        lead,
        agent("ok", reply("fine", tokens=3)),
        agent("cut", reply("half", tokens=5, stop=ReplyStop.MAX_OUTPUT_TOKENS)),
        agent("failing", reply(stop=ReplyStop.PROVIDER_UNAVAILABLE)),
        agent("looper", reply(calls=(("ping", {}),), tokens=7), tools=(http_tool("ping"),), budget=Budget(max_turns=2)),
    )
    pending = await bench.run(runtime, "lead", "go")
    statuses = {child.agent.name: runtime.settled_result(child) for child in runtime.handle(pending.handle_id).children}
    assert {name: result.status for name, result in statuses.items()} == {
        "ok": Status.DONE,
        "cut": Status.INCOMPLETE,
        "failing": Status.ERROR,
        "looper": Status.INCOMPLETE,
    }
    for name, result in statuses.items():
        assert result.usage == runtime.handle(result.handle_id).usage, name  # a result reads its handle's figures
    assert pending.status is Status.PENDING and pending.usage.total_tokens == 11 + 13 + 3 + 5 + 0 + 14
    assert_tree_rule(runtime)
    timed_out = await runtime.wait(pending.handle_id, 0)
    assert timed_out.usage == pending.usage
    done = await bench.resume(runtime, pending, data={"answer": "yes"})
    assert done.status is Status.DONE and done.usage.total_tokens == pending.usage.total_tokens + 17
    assert_tree_rule(runtime)


# ---- prices ---------------------------------------------------------------------------------


async def test_a_reply_is_priced_once_from_the_table_and_an_unpriced_one_marks_its_sums(benches: Benches) -> None:
    bench = await benches.scripted(prices=priced_table())
    lead = agent(
        "lead",
        billed(calls=(("task", {"agent": "free", "prompt": "go"}),), usage=SPLIT),
        billed("done", SPLIT),
        model="priced-a",
        team=("free",),
    )
    runtime = await bench.create(lead, agent("free", billed("spent", SPLIT), model="unpriced"))
    result = await bench.run(runtime, "lead", "go")
    child = runtime.handle(result.handle_id).children[0]
    assert child.usage.own_cost == child.usage.total_cost == Cost(0, "USD", priced=False)
    assert result.usage.own_cost == Cost(2 * FIRST, "USD", priced=True)
    assert result.usage.total_cost == Cost(2 * FIRST, "USD", priced=False)  # a call no price covers is in the sum
    assert (result.usage.own_tokens, child.usage.own_tokens) == (2 * 1082, 1082)  # unpriced tokens still count
    assert_tree_rule(runtime)


async def test_a_changed_price_applies_to_later_replies_only_and_the_journal_keeps_each_cost(benches: Benches) -> None:
    table = SwitchablePrices(priced_table())
    bench = await benches.scripted(prices=table)
    runtime = await bench.create(agent("spender", billed("spent", SPLIT), model="priced-a"))
    first = await bench.run(runtime, "spender", "one")
    assert first.usage.own_cost == Cost(FIRST, "USD")
    table.current = priced_table(output="20")
    await runtime.wake(first.handle_id, "two")
    second = await runtime.wait(first.handle_id, None)
    assert second.usage.own_cost == second.usage.total_cost == Cost(FIRST + SECOND, "USD")
    table.current = priced_table(output="1000")  # a replay reads each reply's cost from the journal
    stored = await bench.store.load(runtime.key)
    assert stored is not None
    rebuilt = Tree(runtime.key, stored.agents)
    replay(rebuilt, stored.entries)
    assert rebuilt.handles[first.handle_id].usage == runtime.handle(first.handle_id).usage


# ---- figures over time ----------------------------------------------------------------------


async def test_figures_never_go_down_between_reads_not_even_when_a_run_is_rolled_back(benches: Benches) -> None:
    figures = Figures()
    bench = await benches.scripted(observers=(figures.observe,))
    lead = agent(
        "lead",
        reply(calls=(("task", {"agent": "w", "prompt": "a"}), ("task", {"agent": "w", "prompt": "b"})), tokens=10),
        reply(calls=(("task", {"agent": "slow", "prompt": "c"}),), tokens=10),
        reply("done", tokens=10),
        team=("w", "slow"),
    )
    worker = agent(
        "w", reply(calls=(("ping", {}),), tokens=7, delay=1), reply("pinged", tokens=3, delay=2), tools=(http_tool("ping"),)
    )
    slow = agent("slow", reply(calls=(("ping", {}),), tokens=7), reply("late", tokens=3, delay=10), tools=(http_tool("ping"),))
    runtime = await bench.create(lead, worker, slow)
    handle_id = await bench.spawn(runtime, "lead")
    await runtime.wake(handle_id, "go")
    for _ in range(4):
        await bench.clock.advance(1)
        figures.read(runtime)
    lead_handle = runtime.handle(handle_id)
    before = lead_handle.usage  # two turns of its own, and its children's four
    assert (before.own_tokens, before.total_tokens) == (20, 20 + 2 * (7 + 3) + 7)
    await bench.clock.advance(5)
    figures.read(runtime)
    await runtime.interrupt(handle_id)  # the lead's run is rolled back, its children's with it: what they spent stays
    figures.read(runtime)
    assert lead_handle.transcript == [] and lead_handle.usage == before
    await bench.clock.advance(20)
    figures.read(runtime)
    figures.assert_never_decrease()
    assert sum(len(reads) for reads in figures.reads.values()) > 20


async def test_turn_ended_events_carry_each_reply_and_the_figures_after_it(bench: Bench) -> None:
    runtime = await bench.create(
        agent("w", billed(calls=(("ping", {}),), usage=W1), billed("done", W2), tools=(http_tool("ping"),))
    )
    watcher = Watcher(runtime, deltas=False)
    result = await bench.run(runtime, "w", "go")
    await bench.clock.settle()
    await watcher.stop()
    ends: list[Event] = [event for event in watcher.events if event.kind is EventKind.TURN_ENDED]
    assert [(end.turn, end.split, end.tokens) for end in ends] == [(1, W1, W1.total), (2, W2, W2.total)]
    assert [end.own_tokens for end in ends] == [W1.total, W1.total + W2.total]
    assert ends[-1].usage == result.usage and sum(end.tokens for end in ends) == result.usage.own_tokens
    assert not any(end.usage_estimated for end in ends)


async def test_each_reply_counts_once_in_the_tenants_ledger_over_judges_and_a_resume(benches: Benches) -> None:
    bench = await benches.scripted(quotas=Quotas(tokens_per_day=10**9))
    judged = agent(
        "writer",
        reply(calls=(("ask", {"question": "tone?"}),), tokens=30),
        reply("final", tokens=30),
        completion=CompletionGate(judge_agent="judge"),
    )
    runtime = await bench.create(judged, agent("judge", reply("PASS", tokens=5)))
    asked = await bench.run(runtime, "writer", "write")
    again = await bench.resume(runtime, asked, data={"tone": "dry"})
    assert again.status is Status.DONE and again.usage.total_tokens == 65
    assert await bench.resume(runtime, asked, data={"tone": "dry"}) == again  # a repeated answer buys nothing
    spent = sum(tokens for _, tokens, _ in await bench.store.tokens_since(bench.tenant, 0))
    assert spent == sum(handle.usage.own_tokens for handle in runtime.handles.values()) == 65


# ---- usage a provider reports wrong, or not at all --------------------------------------------


@pytest.mark.parametrize(
    "usage",
    [Tokens(output=1, reasoning=5), Tokens(input=-1, output=3), Tokens(input=MAX_REPLY_TOKENS, output=1)],
    ids=["reasoning-past-output", "negative", "past-the-most-a-reply-counts"],
)
async def test_a_reply_whose_usage_is_absurd_is_a_bad_reply_and_is_never_counted(benches: Benches, usage: Tokens) -> None:
    bench, model = await benches.planned()
    model.plan("solo", billed("hello", usage))
    runtime = await bench.create(agent("solo"))
    result = await bench.run(runtime, "solo", "go")
    assert (result.status, result.failure and result.failure.reason) == (Status.ERROR, FailureReason.PROVIDER_BAD_REPLY)
    assert (result.usage.turns, result.usage.own_tokens, result.usage.own_split) == (0, 0, Tokens())
    assert [m.role for m in runtime.transcript(result.handle_id)] == ["user"]  # the reply was not used


async def test_usage_a_provider_does_not_report_is_estimated_split_and_said_so_up_the_tree(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("lead", reply(calls=(("task", {"agent": "w", "prompt": "go"}),), tokens=9), reply("done", tokens=9))
    model.plan("w", reply("a reply of some forty characters, or so", tokens=9))
    model.unreported.add("w")
    runtime = await bench.create(agent("lead", team=("w",)), agent("w"))
    result = await bench.run(runtime, "lead", "go")
    child = runtime.handle(result.handle_id).children[0]
    split = child.usage.own_split
    assert split.input > 0 and split.output > 0 and (split.cache_read, split.cache_write, split.reasoning) == (0, 0, 0)
    assert child.usage.own_estimated and child.usage.total_estimated
    assert (result.usage.own_estimated, result.usage.total_estimated) == (False, True)  # the lead's own were reported
    assert result.usage.own_tokens == 18 and result.usage.total_tokens == 18 + split.total
    assert_tree_rule(runtime)
