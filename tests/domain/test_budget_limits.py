"""Budgets in a running runtime (docs/budgets.md), in-process: every Limit stops a run loudly, a
child is carved what its parent has left when it is spawned, spend is checked live against
every ancestor's budget, and a budget that asks suspends on a `budget` Request whose answer
extends it (within what the ancestors allow), declines it, or is refused and changes nothing.
Tool calls count from when they start, so calls at once never pass a subtree's cap together."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from agentruntime_server.domain.billing.usage import Tokens
from agentruntime_server.domain.errors import InvalidArgument, ResourceExhausted
from agentruntime_server.domain.journal import Tree, replay
from agentruntime_server.domain.journal.events import EventKind
from agentruntime_server.domain.runs import budgets
from agentruntime_server.domain.vocabulary import (
    AgentSpec,
    Answer,
    Budget,
    HandleState,
    Limit,
    OnExhausted,
    RelayExecutor,
    Status,
    ToolOutput,
    ToolSpec,
)

from tests.domain.harness import Bench, agent, http_tool, reply
from tests.domain.kit_turns import NEVER_HANGS, Benches, Watcher, child_of, price, prices

pytestmark = NEVER_HANGS

PING = http_tool("ping")
# 1001 x 2.5 + 3 x 0.25 + 1 x 3.125 + 77 x 10 = 3276.375 micros: 3276 a reply (reasoning is inside output).
SPLIT = Tokens(input=1001, cache_read=3, cache_write=1, output=77, reasoning=20)
COST = 3276
PRICED = prices(price("scripted", "priced-*", "2.5", "0.25", "3.125", "10"))


def asking(**fields: Any) -> Budget:
    return Budget(on_exhausted=OnExhausted.ASK, **fields)


def delegating(name: str, *prompts: str, **fields: Any) -> AgentSpec:
    """An agent whose first reply sends a task call per `agent:prompt`, and whose second is "done"."""
    calls = tuple(("task", {"agent": prompt.split(":")[0], "prompt": prompt}) for prompt in prompts)
    made: AgentSpec = agent(name, reply(calls=calls, tokens=10), reply("done", tokens=10), **fields)
    return made


def pinging(name: str, count: int = 1, tokens: int = 5, delay: float = 0.0, **fields: Any) -> AgentSpec:
    """An agent whose every reply calls ping `count` times."""
    made: AgentSpec = agent(name, reply(calls=(("ping", {}),) * count, tokens=tokens, delay=delay), tools=(PING,), **fields)
    return made


# ---- each limit ---------------------------------------------------------------------------


async def test_max_turns_counts_a_handles_turns_over_all_its_runs(bench: Bench) -> None:
    runtime = await bench.create(agent("solo", reply("once", tokens=3)))
    first = await bench.run(runtime, "solo", "go", budget=Budget(max_turns=1))
    assert (first.status, first.usage.turns) == (Status.DONE, 1)
    await runtime.wake(first.handle_id, "again")
    second = await runtime.wait(first.handle_id, None)
    assert (second.status, second.limit, second.text, second.usage.turns) == (
        Status.INCOMPLETE,
        Limit.MAX_TURNS,
        "stopped at LIMIT_MAX_TURNS",
        1,
    )


async def test_max_tokens_stops_before_a_turn_once_what_is_spent_reaches_it(bench: Bench) -> None:
    runtime = await bench.create(pinging("looper", tokens=40))
    result = await bench.run(runtime, "looper", "go", budget=Budget(max_tokens=100))
    # 0, 40 and 80 spent are under 100: three turns; at 120 no fourth starts (the scripted model
    # reserves nothing, so a turn is checked against what is spent).
    assert (result.status, result.limit, result.usage.turns, result.usage.own_tokens) == (
        Status.INCOMPLETE,
        Limit.MAX_TOKENS,
        3,
        120,
    )


async def test_max_tool_calls_answers_the_calls_past_it_as_not_run(bench: Bench) -> None:
    runtime = await bench.create(pinging("prober", count=3))
    result = await bench.run(runtime, "prober", "go", budget=Budget(max_tool_calls=2))
    assert (result.status, result.limit, result.usage.tool_calls) == (Status.INCOMPLETE, Limit.MAX_TOOL_CALLS, 2)
    assert bench.tools.count("ping") == 2
    outputs = [(m.content, m.is_error) for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert outputs == [("ok", False), ("ok", False), ("not run: the tool call budget is used up (LIMIT_MAX_TOOL_CALLS)", True)]


async def test_a_childs_run_ends_at_its_parents_wall_time(bench: Bench) -> None:
    lead = delegating("lead", "slow:dig", team=("slow",))
    runtime = await bench.create(lead, agent("slow", reply("late", delay=60)))
    handle_id = await bench.spawn(runtime, "lead", budget=Budget(max_wall_time=5))
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await bench.clock.advance(4.9)
    assert not waiting.done()
    await bench.clock.advance(0.1)
    assert waiting.done()  # settled by then: a run still waiting fails here, not hangs
    result = await waiting
    assert (result.status, result.limit) == (Status.INCOMPLETE, Limit.MAX_WALL_TIME)
    child = child_of(runtime, handle_id)
    assert child.budget.max_wall_time is None  # its own budget has none: its run's deadline was its parent's
    assert child.last_result is not None and (child.last_result.status, child.last_result.limit) == (
        Status.INCOMPLETE,
        Limit.MAX_WALL_TIME,
    )
    assert (child.state, child.usage.turns) == (HandleState.IDLE, 0)
    await bench.clock.advance(60)
    assert child.usage.turns == 0  # its model call was cut: no reply lands later


async def test_a_task_call_past_max_children_is_an_error_result_and_a_spawn_is_refused(bench: Bench) -> None:
    lead = delegating("lead", "w:a", "w:b", team=("w",), budget=Budget(max_children=1))
    runtime = await bench.create(lead, agent("w", reply("done")))
    result = await bench.run(runtime, "lead", "go")
    first, second = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert (first.content, first.is_error) == ("done", False)
    assert second.is_error and second.content.startswith("not spawned: ") and second.content.endswith("(LIMIT_MAX_CHILDREN)")
    assert len(runtime.handle(result.handle_id).children) == 1
    with pytest.raises(ResourceExhausted) as refused:
        await runtime.spawn(result.handle_id, "w", None)
    assert refused.value.limit is Limit.MAX_CHILDREN and len(runtime.handles) == 2


async def test_max_depth_is_carved_a_level_less_and_at_0_a_handle_may_not_delegate(bench: Bench) -> None:
    lead = delegating("lead", "mid:a", team=("mid",), budget=Budget(max_depth=1))
    mid = delegating("mid", "w:b", team=("w",))
    runtime = await bench.create(lead, mid, agent("w", reply("done")))
    result = await bench.run(runtime, "lead", "go")
    middle = child_of(runtime, result.handle_id)
    assert middle.budget.max_depth == 0 and middle.children == []
    [tool] = [m for m in middle.transcript if m.role == "tool"]
    assert tool.is_error and tool.content.endswith("(LIMIT_MAX_DEPTH)")
    with pytest.raises(ResourceExhausted) as refused:
        await runtime.spawn(middle.id, "w", None)
    assert refused.value.limit is Limit.MAX_DEPTH


async def test_max_cost_stops_the_turn_after_the_budget_is_spent(benches: Benches) -> None:
    bench = await benches.scripted(prices=PRICED)
    runtime = await bench.create(agent("spender", reply("spent", tokens=0, usage=SPLIT), model="priced-a"))
    first = await bench.run(runtime, "spender", "one", budget=Budget(max_cost=1000))
    assert (first.status, first.usage.own_cost.micros) == (Status.DONE, COST)  # checked before a turn: it started under it
    await runtime.wake(first.handle_id, "two")
    stopped = await runtime.wait(first.handle_id, None)
    assert (stopped.status, stopped.limit, stopped.usage.turns) == (Status.INCOMPLETE, Limit.MAX_COST, 1)


# ---- carving and live checks ----------------------------------------------------------------


async def test_a_child_is_carved_the_least_of_its_own_budget_and_what_its_parent_has_left(benches: Benches) -> None:
    bench = await benches.scripted(prices=PRICED)
    lead = agent(
        "lead",
        reply(calls=(("ping", {}), ("task", {"agent": "w", "prompt": "go"})), tokens=0, usage=SPLIT),
        reply("done"),
        model="priced-a",
        team=("w",),
        tools=(PING,),
    )
    worker = agent("w", reply("done", tokens=1), budget=Budget(max_turns=2, max_tokens=50_000, max_concurrent=3))
    runtime = await bench.create(lead, worker)
    own = Budget(max_turns=5, max_tokens=10_000, max_tool_calls=4, max_cost=10_000, max_depth=3, max_wall_time=60)
    result = await bench.run(runtime, "lead", "go", budget=own)
    child = child_of(runtime, result.handle_id)
    # At its spawn the lead had spent a turn, 1,082 tokens, 3,276 micros and two calls (the
    # ping and the task call itself, counted from their start).
    assert child.budget == Budget(
        max_turns=2,  # its own, fewer than the lead's 4 left
        max_tokens=10_000 - 1082,  # the lead's left, fewer than its own
        max_tool_calls=2,
        max_depth=2,
        max_concurrent=3,  # its own: about its own children
        max_cost=10_000 - COST,
    )


async def test_a_childs_turn_is_checked_against_every_ancestors_budget_live(bench: Bench) -> None:
    """Two children carved 90 tokens each at once: the fast one spends the lead's budget, and the
    slow one, 5 tokens into its own 90, stops at the lead's limit."""
    lead = delegating("lead", "fast:a", "slow:b", team=("fast", "slow"))
    runtime = await bench.create(lead, pinging("fast", tokens=50, delay=1), pinging("slow", tokens=5, delay=5))
    handle_id = await bench.spawn(runtime, "lead", budget=Budget(max_tokens=100))
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await bench.clock.advance(5)
    assert waiting.done()  # settled by then: a run still waiting fails here, not hangs
    result = await waiting
    fast, slow = runtime.handle(handle_id).children
    assert (fast.budget.max_tokens, slow.budget.max_tokens) == (90, 90)
    assert (fast.usage.total_tokens, slow.usage.total_tokens) == (100, 5)
    assert slow.last_result is not None and (slow.last_result.status, slow.last_result.limit) == (
        Status.INCOMPLETE,
        Limit.MAX_TOKENS,
    )
    assert budgets.exhausted(slow) == (Limit.MAX_TOKENS, runtime.handle(handle_id))  # the lead's budget, not its own
    assert (result.status, result.limit, result.usage.total_tokens) == (Status.INCOMPLETE, Limit.MAX_TOKENS, 115)


async def test_a_child_that_asks_stops_at_its_parents_token_budget_used_up_with_its_own(bench: Bench) -> None:
    lead = delegating("lead", "w:a", team=("w",))
    runtime = await bench.create(lead, pinging("w", tokens=130, budget=asking()))
    result = await bench.run(runtime, "lead", "go", budget=Budget(max_tokens=300))
    child = child_of(runtime, result.handle_id)
    # Carved the lead's 290 left; 0, 130 and 260 are under it: at 390 both budgets are used up,
    # and no extension of its own could let it go on: it stops instead of asking.
    assert (child.budget.max_tokens, child.usage.total_tokens, child.usage.turns) == (290, 390, 3)
    assert (child.state, child.pending) == (HandleState.IDLE, None)
    assert child.last_result is not None and child.last_result.status is Status.INCOMPLETE
    assert (result.status, result.limit, result.usage.total_tokens) == (Status.INCOMPLETE, Limit.MAX_TOKENS, 400)


async def test_a_child_that_asks_stops_at_its_parents_tool_call_budget_used_up_with_its_own(bench: Bench) -> None:
    lead = delegating("lead", "w:a", team=("w",))
    worker = agent("w", reply(calls=(("ping", {}),) * 3), reply("pinged"), tools=(PING,), budget=asking())
    runtime = await bench.create(lead, worker)
    result = await bench.run(runtime, "lead", "go", budget=Budget(max_tool_calls=3))
    child = child_of(runtime, result.handle_id)
    # The task call is under way: the child is carved 2 calls, and its 2 use up the lead's too.
    assert bench.tools.count("ping") == 2
    assert (child.budget.max_tool_calls, child.usage.tool_calls, child.state, child.pending) == (2, 2, HandleState.IDLE, None)
    assert child.last_result is not None and (child.last_result.status, child.last_result.limit) == (
        Status.INCOMPLETE,
        Limit.MAX_TOOL_CALLS,
    )
    assert result.status is Status.DONE, result  # the lead's model reads the child's stop


async def test_a_child_that_asks_with_room_in_its_parents_budget_asks_and_is_extended_within_it(bench: Bench) -> None:
    lead = delegating("lead", "w:a", team=("w",))
    runtime = await bench.create(lead, pinging("w", tokens=30, budget=asking(max_tokens=40)))
    pending = await bench.run(runtime, "lead", "go", budget=Budget(max_tokens=500))
    request = pending.pending
    assert pending.status is Status.PENDING and request is not None and request.kind == "budget"
    assert (request.path[-1], request.data["limit"], request.data["used"], request.data["budget"]) == (
        "w.1",
        "LIMIT_MAX_TOKENS",
        60,
        40,
    )
    child = child_of(runtime, pending.handle_id)
    assert child.state is HandleState.SUSPENDED and runtime.handle(pending.handle_id).state is HandleState.SUSPENDED
    # Asked for 10,000: extended to the lead's 500 less what the lead spent itself (10).
    resuming = asyncio.ensure_future(bench.resume(runtime, pending, data={"extend": {"max_tokens": 10_000}}))
    await bench.clock.settle()
    assert child.budget.max_tokens == 490
    result = await resuming
    assert (result.status, result.limit, result.usage.total_tokens) == (Status.INCOMPLETE, Limit.MAX_TOKENS, 520)


# ---- budgets that ask ------------------------------------------------------------------------


def prober() -> AgentSpec:
    probe = reply(calls=(("probe", {"what": "disk"}),), tokens=10)
    made: AgentSpec = agent("prober", probe, reply("finished", tokens=10), tools=(http_tool("probe"),))
    return made


async def test_a_turn_budget_that_asks_is_extended_and_the_same_answer_again_runs_nothing(bench: Bench) -> None:
    runtime = await bench.create(prober())
    pending = await bench.run(runtime, "prober", "probe", budget=asking(max_turns=1))
    request = pending.pending
    assert request is not None and (pending.status, request.kind) == (Status.PENDING, "budget")
    assert (request.data["limit"], request.data["field"], request.data["used"], request.data["budget"]) == (
        "LIMIT_MAX_TURNS",
        "max_turns",
        1,
        1,
    )
    assert request.id == f"{pending.handle_id}/budget:LIMIT_MAX_TURNS@1/1"
    answer = Answer(id=request.id, ok=True, data={"extend": {"max_turns": 3}})
    done = await runtime.resume(answer)
    assert (done.status, done.text, done.usage.turns) == (Status.DONE, "finished", 2)
    assert runtime.handle(pending.handle_id).budget.max_turns == 3
    assert await runtime.resume(answer) == done
    assert (bench.tools.count("probe"), runtime.handle(pending.handle_id).usage.turns) == (1, 2)


async def test_a_budget_answer_that_cannot_be_taken_is_refused_naming_its_field_and_changes_nothing(bench: Bench) -> None:
    runtime = await bench.create(prober())
    pending = await bench.run(runtime, "prober", "probe", budget=asking(max_turns=1))
    assert pending.pending is not None
    handle = runtime.handle(pending.handle_id)
    before = (handle.state, handle.pending, handle.budget, len(handle.transcript))
    for extend, field in (
        ({"max_tokens": 1000}, "answer.data.extend.max_turns"),  # another field: max_turns stays used up
        ({"max_turns": 1}, "answer.data.extend.max_turns"),  # not past what is used
        ({"max_turns": -1}, "answer.data.extend.max_turns"),
        ({"max_turns": 2.5}, "answer.data.extend.max_turns"),
        ({"max_bananas": 2}, "answer.data.extend.max_bananas"),
    ):
        with pytest.raises(InvalidArgument) as refused:
            await bench.resume(runtime, pending, data={"extend": extend})
        assert [violation.field for violation in refused.value.violations] == [field], extend
        assert (handle.state, handle.pending, handle.budget, len(handle.transcript)) == before
    stopped = await bench.resume(runtime, pending, ok=False, reason="enough")
    assert (stopped.status, stopped.limit, stopped.usage.turns) == (Status.INCOMPLETE, Limit.MAX_TURNS, 1)
    assert (handle.state, handle.pending) == (HandleState.IDLE, None)
    assert bench.tools.count("probe") == 1


async def test_a_tool_call_budget_that_asks_runs_the_rest_once_after_the_extension(bench: Bench) -> None:
    bench.tools.bodies["probe"] = lambda arguments: f"probe ok #{arguments['n']}"
    calls = tuple(("probe", {"n": n}) for n in (1, 2, 3))
    runtime = await bench.create(agent("prober", reply(calls=calls), reply("probed"), tools=(http_tool("probe"),)))
    pending = await bench.run(runtime, "prober", "probe thrice", budget=asking(max_tool_calls=1))
    assert pending.pending is not None and pending.pending.data["limit"] == "LIMIT_MAX_TOOL_CALLS"
    assert (bench.tools.count("probe"), pending.usage.tool_calls) == (1, 1)
    done = await bench.resume(runtime, pending, data={"extend": {"max_tool_calls": 3}})
    assert (done.status, done.text, done.usage.tool_calls) == (Status.DONE, "probed", 3)
    outputs = [m.content for m in runtime.transcript(done.handle_id) if m.role == "tool"]
    assert outputs == ["probe ok #1", "probe ok #2", "probe ok #3"]
    keys = Counter(key for _, _, key in bench.tools.calls)
    assert sorted(keys) == [f"{runtime.key}/{done.handle_id}/call_1_{n}" for n in (1, 2, 3)] and set(keys.values()) == {1}


async def test_a_cost_budget_that_asks_is_extended_by_its_answer(benches: Benches) -> None:
    bench = await benches.scripted(prices=PRICED)
    runtime = await bench.create(agent("asking", reply("spent", tokens=0, usage=SPLIT), model="priced-a"))
    first = await bench.run(runtime, "asking", "one", budget=asking(max_cost=1000))
    await runtime.wake(first.handle_id, "two")
    asked = await runtime.wait(first.handle_id, None)
    assert asked.status is Status.PENDING and asked.pending is not None
    assert (asked.pending.data["field"], asked.pending.data["used"]) == ("max_cost", COST)
    done = await bench.resume(runtime, asked, data={"extend": {"max_cost": 100_000}})
    assert (done.status, done.usage.turns, done.usage.own_cost.micros) == (Status.DONE, 2, 2 * COST)


# ---- tool calls of a subtree ------------------------------------------------------------------


async def test_children_running_at_once_never_pass_their_ancestors_tool_call_budget(bench: Bench) -> None:
    lead = delegating("lead", "w:a", "w:b", team=("w",), budget=Budget(max_tool_calls=3))
    runtime = await bench.create(lead, pinging("w", count=3))
    result = await bench.run(runtime, "lead", "go")
    # The two task calls count from when they start: one ping is left for both children.
    assert bench.tools.count("ping") == 1
    assert (result.status, result.usage.tool_calls, result.usage.subtree_tool_calls) == (Status.DONE, 2, 3)
    children = runtime.handle(result.handle_id).children
    assert [child.last_result.status for child in children if child.last_result] == [Status.INCOMPLETE] * 2
    outputs = [m.content for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert len(outputs) == 2 and all("LIMIT_MAX_TOOL_CALLS" in output for output in outputs), outputs


async def test_a_task_call_counts_while_its_child_runs(bench: Bench) -> None:
    runtime = await bench.create(delegating("lead", "w:a", team=("w",)), pinging("w", count=2))
    result = await bench.run(runtime, "lead", "go", budget=Budget(max_tool_calls=2))
    child = child_of(runtime, result.handle_id)
    assert bench.tools.count("ping") == 1 and result.usage.subtree_tool_calls == 2
    assert (child.budget.max_tool_calls, child.usage.tool_calls) == (1, 1)
    assert child.last_result is not None and child.last_result.status is Status.INCOMPLETE
    assert (result.status, result.usage.tool_calls) == (Status.DONE, 1)


async def test_a_call_out_to_the_host_counts_until_answered_and_replay_rebuilds_the_count(bench: Bench) -> None:
    relay = ToolSpec("fetch", "the host's fetch", {"type": "object"}, RelayExecutor())
    lead = delegating("lead", "asker:a", "w:b", team=("asker", "w"), budget=Budget(max_tool_calls=3))
    asker = agent("asker", reply(calls=(("fetch", {}),)), reply("fetched"), tools=(relay,))
    runtime = await bench.create(lead, asker, pinging("w", count=3, delay=1))  # w pings once the fetch is out
    handle_id = await bench.spawn(runtime, "lead")
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await bench.clock.advance(1)
    assert waiting.done()  # settled by then: a run still waiting fails here, not hangs
    pending = await waiting
    assert pending.pending is not None and pending.pending.kind == "tool_call"
    assert bench.tools.count("ping") == 0  # two task calls and the relay call out: nothing left
    stored = await bench.store.load(runtime.key)
    assert stored is not None
    rebuilt = Tree(runtime.key, stored.agents)
    replay(rebuilt, stored.entries)

    def under_way(tree: Tree) -> dict[str, tuple[frozenset[str], int]]:
        return {key: (frozenset(handle.calls_out), handle.subtree_calls_out) for key, handle in tree.handles.items()}

    assert under_way(rebuilt) == under_way(runtime.tree)
    assert runtime.handle(handle_id).subtree_calls_out == 2  # the asker's task call, still waiting, and its relay call
    [(call, _)] = pending.pending.calls
    done = await runtime.resume(Answer(id=pending.pending.id, ok=True, outputs=(ToolOutput(call.id, "fetched"),)))
    assert done.status is Status.DONE and done.usage.subtree_tool_calls == 3
    assert all(count == 0 for _, count in under_way(runtime.tree).values())


async def test_a_child_waiting_for_its_parents_max_concurrent_shows_queued(bench: Bench) -> None:
    lead = delegating("lead", "slowpoke:1", "slowpoke:2", team=("slowpoke",), budget=Budget(max_concurrent=1))
    runtime = await bench.create(lead, agent("slowpoke", reply("done", delay=1)))
    handle_id = await bench.spawn(runtime, "lead")
    watcher = Watcher(runtime, deltas=False)
    await runtime.wake(handle_id, "go")
    await bench.clock.settle()
    first, second = f"{handle_id}/slowpoke.1", f"{handle_id}/slowpoke.2"
    assert (runtime.handle(first).state, runtime.handle(second).state) == (HandleState.RUNNING, HandleState.QUEUED)
    await bench.clock.advance(1)
    assert (runtime.handle(first).state, runtime.handle(second).state) == (HandleState.IDLE, HandleState.RUNNING)
    await bench.clock.advance(1)
    result = await runtime.wait(handle_id, None)
    assert (result.status, result.text) == (Status.DONE, "done")
    await bench.clock.settle()
    await watcher.stop()

    def states(handle: str) -> list[HandleState | None]:
        return [e.state for e in watcher.events if e.handle_id == handle and e.kind is EventKind.STATE_CHANGED]

    assert states(second) == [HandleState.RUNNING, HandleState.QUEUED, HandleState.RUNNING, HandleState.IDLE]
    assert HandleState.QUEUED not in states(first)


async def test_children_queued_by_max_concurrent_run_in_the_order_they_were_woken(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("fan", reply(calls=tuple(("task", {"agent": "worker", "prompt": f"job {n}"}) for n in range(4))), reply("merged"))
    model.plan("worker", reply("worked", delay=1))
    runtime = await bench.create(agent("fan", team=("worker",), budget=Budget(max_concurrent=1)), agent("worker"))
    handle_id = await bench.spawn(runtime, "fan")
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await bench.clock.advance(4)
    assert waiting.done() and (await waiting).status is Status.DONE
    assert model.peak == 1
    jobs = [request.messages[-1].content for request in model.requests if request.agent.name == "worker"]
    assert jobs == ["job 0", "job 1", "job 2", "job 3"]
