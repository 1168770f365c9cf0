"""Budgets in the domain alone: carved at spawn from what the parent has left, checked up the
ancestor chain, extended only past what is used. The handles are built by a journal over a
fake store (tests/support/fakes.py) on a fake clock, as a runtime builds them."""

from __future__ import annotations

import pytest
from agentruntime_server.domain.billing.usage import Cost, Tokens
from agentruntime_server.domain.errors import InvalidArgument, ResourceExhausted
from agentruntime_server.domain.journal import CallStarted, Journal, ModelReplied, RunStarted, Spawned, TurnStarted
from agentruntime_server.domain.runs import budgets as budget
from agentruntime_server.domain.vocabulary import AgentSpec, Budget, Limit, Message, ToolCall

from tests.support.clock import FakeClock
from tests.support.fakes import journal

AGENTS = (AgentSpec("lead", team=("w",)), AgentSpec("w"))
LEAD, CHILD = "root/lead.1", "root/lead.1/w.1"
UNBOUNDED = Budget()
TASK = ToolCall("call_1", "task", '{"agent": "w", "prompt": "do"}')


async def turn(live: Journal, handle_id: str, tokens: int, *calls: ToolCall, micros: int = 0) -> None:
    """One model turn of the handle: its reply (input and output), what it cost, and the calls it makes starting."""
    handle = live.tree.handles[handle_id]
    number = handle.usage.turns + 1
    split, cost = Tokens(input=tokens - tokens // 2, output=tokens // 2), Cost(micros, "USD")
    await live.record(RunStarted(handle_id, Message("user", "go")), TurnStarted(handle_id, number))
    await live.record(
        ModelReplied(
            handle_id,
            Message("assistant", "", calls, turn=number),
            tokens,
            handle.usage.after_reply(split, cost),
            split=split,
            cost=cost,
        )
    )
    for call in calls:
        await live.record(CallStarted(handle_id, call))


async def lead_with_a_child(lead_budget: Budget, child_budget: Budget = UNBOUNDED) -> Journal:
    """A lead that spent 60 tokens on a turn whose task call spawned a child, carved as a runtime carves it."""
    live: Journal = journal(AGENTS, clock=FakeClock())[0]
    await live.record(Spawned(LEAD, "", "lead", lead_budget, "", 1))
    await turn(live, LEAD, 60, TASK)
    carved = budget.carve(child_budget, live.tree.handles[LEAD])
    await live.record(Spawned(CHILD, LEAD, "w", carved, TASK.id, 1))
    return live


async def test_a_child_is_carved_to_what_its_parent_has_left() -> None:
    live = await lead_with_a_child(Budget(max_turns=3, max_tokens=100, max_tool_calls=2, max_children=2, max_depth=2))
    lead = live.tree.handles[LEAD]
    # Turns, tokens and tool calls left to the parent (its task call counts from its start), a level less of depth.
    assert live.tree.handles[CHILD].budget == Budget(max_turns=2, max_tokens=40, max_tool_calls=1, max_depth=1)
    assert budget.carve(Budget(max_tokens=10, max_turns=9), lead) == Budget(
        max_turns=2, max_tokens=10, max_tool_calls=1, max_depth=1
    )
    # A judge or a summarizer works on the parent's turns: its own are its own.
    assert budget.carve(Budget(max_turns=9), lead, delegated=False).max_turns == 9
    assert budget.carve(Budget(max_turns=9), None) == Budget(max_turns=9)  # a top-level handle keeps its own


async def test_a_turn_limit_is_the_handles_own_and_a_token_limit_the_topmost_one_spent() -> None:
    live = await lead_with_a_child(Budget(max_tokens=100), Budget(max_turns=1))
    child, lead = live.tree.handles[CHILD], live.tree.handles[LEAD]
    assert budget.exhausted(child) is None
    await turn(live, CHILD, 30)
    assert (lead.usage.total_tokens, child.usage.total_tokens) == (90, 30)
    limit, whose = budget.exhausted(child) or (None, None)
    assert (limit, whose) == (Limit.MAX_TURNS, child)

    live = await lead_with_a_child(Budget(max_tokens=100), Budget(max_tokens=500))
    child, lead = live.tree.handles[CHILD], live.tree.handles[LEAD]
    assert child.budget.max_tokens == 40  # carved to what the lead has left
    await turn(live, CHILD, 40)
    # Both budgets are used up: the lead's sets the limit (no extension of the child's could help).
    assert budget.exhausted(child) == (Limit.MAX_TOKENS, lead)
    assert budget.exhausted(lead) == (Limit.MAX_TOKENS, lead)


async def test_tool_calls_left_are_the_fewest_any_ancestor_allows() -> None:
    live = await lead_with_a_child(Budget(max_tool_calls=3), Budget(max_tool_calls=5))
    child = live.tree.handles[CHILD]
    assert child.budget.max_tool_calls == 2  # the lead's task call is spent already
    assert budget.tool_calls_left(child) == 2
    await turn(live, CHILD, 1, ToolCall("call_2", "ping", "{}"))
    assert budget.tool_calls_left(child) == 1
    assert budget.binding_tool_calls(child) is live.tree.handles[LEAD]  # a tie: the topmost, the one that could be raised


async def test_a_spawn_past_max_children_or_at_max_depth_is_refused_naming_the_limit() -> None:
    live = await lead_with_a_child(Budget(max_children=1, max_depth=1))
    with pytest.raises(ResourceExhausted) as children:
        budget.check_spawn(live.tree.handles[LEAD])
    assert children.value.limit == Limit.MAX_CHILDREN and "max_children 1" in str(children.value)
    with pytest.raises(ResourceExhausted) as depth:
        budget.check_spawn(live.tree.handles[CHILD])  # carved to depth 0
    assert depth.value.limit == Limit.MAX_DEPTH


async def test_an_extension_must_lift_the_exhausted_field_past_what_is_used_within_the_parents_room() -> None:
    live = await lead_with_a_child(Budget(max_tokens=100), Budget(max_tokens=500))
    child = live.tree.handles[CHILD]
    await turn(live, CHILD, 40)
    asked = budget.extended(child, {"max_tokens": 1000})
    assert asked.max_tokens == 40  # the lead's 100 less the 60 it spent itself: no room above what is used
    with pytest.raises(InvalidArgument) as refused:
        budget.check_raised(child, asked, "max_tokens")
    [violation] = refused.value.violations
    assert violation.field == "answer.data.extend.max_tokens" and "no more than the 40 already used" in violation.description
    budget.check_raised(child, Budget(max_tokens=41), "max_tokens")  # one past what is used: accepted
