"""Budgets: carved at spawn from the parent's remaining budget, checked live up the
ancestor chain before every turn, tool call and spawn (a turn's tokens and cost against
what is spent and what the turns under way are reserved: reservations.py).

Scopes: turns are the handle's own; tokens, cost and tool calls are its subtree's (a
parent's budget pays for its delegates); children, depth and concurrency are about the handle's
direct children."""

from __future__ import annotations

import dataclasses

from ..errors import FieldViolation, InvalidArgument, ResourceExhausted
from ..journal.handle import Handle
from ..vocabulary import Budget, Limit


def _smallest(*values: int | None) -> int | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def carve(own: Budget, parent: Handle | None, delegated: bool = True) -> Budget:
    """`delegated`: the child does part of the parent's work (a task call), so its turns come
    out of the parent's; a judge or a summarizer works on the parent's turns instead (a judge
    of the answer of the parent's last turn would get none)."""
    if parent is None:
        return own
    cap = parent.budget

    def left(limit: int | None, used: int) -> int | None:
        return None if limit is None else max(limit - used, 0)

    return Budget(
        max_turns=_smallest(own.max_turns, left(cap.max_turns, parent.usage.turns)) if delegated else own.max_turns,
        max_tokens=_smallest(own.max_tokens, left(cap.max_tokens, parent.usage.total_tokens)),
        max_tool_calls=_smallest(own.max_tool_calls, left(cap.max_tool_calls, parent.subtree_tool_calls_spent)),
        max_wall_time=own.max_wall_time,  # per run; a child's run deadline is carved from its parent's
        max_children=own.max_children,
        max_depth=_smallest(own.max_depth, None if cap.max_depth is None else max(cap.max_depth - 1, 0)),
        max_concurrent=own.max_concurrent,
        on_exhausted=own.on_exhausted,
        max_cost=_smallest(own.max_cost, left(cap.max_cost, parent.usage.total_cost.micros)),
    )


def exhausted(handle: Handle) -> tuple[Limit, Handle] | None:
    """The limit that forbids another model turn now, and whose budget sets it."""
    if handle.budget.max_turns is not None and handle.usage.turns >= handle.budget.max_turns:
        return Limit.MAX_TURNS, handle
    spent = [
        node
        for node in handle.lineage()
        if node.budget.max_tokens is not None and node.usage.total_tokens >= node.budget.max_tokens
    ]
    if spent:
        # The topmost: while an ancestor's budget is used up too, no extension of the handle's
        # own could let it go on (the ancestor caps it), so the handle must not ask for one.
        return Limit.MAX_TOKENS, spent[-1]
    spent = [
        node
        for node in handle.lineage()
        if node.budget.max_cost is not None and node.usage.total_cost.micros >= node.budget.max_cost
    ]
    if spent:
        return Limit.MAX_COST, spent[-1]
    return None


def capped(handle: Handle) -> bool:
    """A budget of the lineage caps tokens or cost: a turn must be reserved against it."""
    node: Handle | None = handle
    while node is not None:  # on every model turn: a plain loop, not a generator
        budget = node.budget
        if budget.max_tokens is not None or budget.max_cost is not None:
            return True
        node = node.parent
    return False


def unaffordable(handle: Handle, tokens: int, micros: int) -> tuple[Limit, Handle] | None:
    """The limit a turn reserved `tokens` and `micros` would pass, counting what is spent and
    what the turns under way hold (reservations.py), and whose budget it is: the topmost, as
    for `exhausted`. A turn fits when, for the handle and every ancestor, spent + held + its
    reservation stays within the budget."""
    over_tokens = over_cost = None
    node: Handle | None = handle
    while node is not None:
        budget = node.budget
        if budget.max_tokens is not None and node.usage.total_tokens + node.held_tokens + tokens > budget.max_tokens:
            over_tokens = node
        if budget.max_cost is not None and node.usage.total_cost.micros + node.held_micros + micros > budget.max_cost:
            over_cost = node
        node = node.parent
    if over_tokens is not None:
        return Limit.MAX_TOKENS, over_tokens
    if over_cost is not None:
        return Limit.MAX_COST, over_cost
    return None


def check_raised(handle: Handle, budget: Budget, field: str) -> None:
    """An extension must lift the exhausted field above what is used, or the run would ask
    again at once: refused, naming what the ancestors allow."""
    used = {
        "max_turns": handle.usage.turns,
        "max_tokens": handle.usage.total_tokens,
        "max_tool_calls": handle.subtree_tool_calls_spent,
        "max_cost": handle.usage.total_cost.micros,
    }.get(field)
    value = getattr(budget, field, None) if field else None
    if used is not None and value is not None and value <= used:
        raise InvalidArgument(
            [
                FieldViolation(
                    f"answer.data.extend.{field}",
                    f"leaves {field} at {value}, no more than the {used} already used "
                    "(an ancestor's budget caps it there); raise the ancestor's budget, or answer not ok to stop",
                )
            ]
        )


def binding_tool_calls(handle: Handle) -> Handle | None:
    """The handle of the lineage whose tool-call budget has the fewest calls left; on a tie the
    topmost (a child carved to its parent's remaining calls uses both up at once, and only
    the ancestor's could be raised)."""
    capped = [node for node in handle.lineage() if node.budget.max_tool_calls is not None]
    return min(reversed(capped), key=lambda node: (node.budget.max_tool_calls or 0) - node.subtree_tool_calls_spent, default=None)


def extended(handle: Handle, fields: dict[str, int]) -> Budget:
    """The handle's budget with a host's extension, within what its parent allows: the
    parent's budget less what the rest of the parent's subtree has spent (the handle's own
    spend is inside the parent's figures, and counts against the handle's part only)."""
    own = dataclasses.replace(handle.budget, **fields)  # type: ignore[arg-type]
    parent = handle.parent
    if parent is None:
        return own
    cap, used = parent.budget, parent.usage

    def room(limit: int | None, parent_used: int, own_used: int) -> int | None:
        return None if limit is None else max(limit - parent_used + own_used, 0)

    return dataclasses.replace(
        own,
        max_turns=_smallest(own.max_turns, room(cap.max_turns, used.turns, 0)),
        max_tokens=_smallest(own.max_tokens, room(cap.max_tokens, used.total_tokens, handle.usage.total_tokens)),
        max_tool_calls=_smallest(
            own.max_tool_calls, room(cap.max_tool_calls, parent.subtree_tool_calls_spent, handle.subtree_tool_calls_spent)
        ),
        max_cost=_smallest(own.max_cost, room(cap.max_cost, used.total_cost.micros, handle.usage.total_cost.micros)),
    )


def tool_calls_left(handle: Handle) -> int | None:
    """How many more tool calls the handle's subtree and every ancestor's allow; None = no cap.
    A call counts from when it starts (its CallStarted), not when it finishes: a task call
    while its child runs, and the calls of siblings running at once, are all spent already."""
    return _smallest(
        *(
            None if node.budget.max_tool_calls is None else max(node.budget.max_tool_calls - node.subtree_tool_calls_spent, 0)
            for node in handle.lineage()
        )
    )


def check_spawn(parent: Handle) -> None:
    """Raises ResourceExhausted when the parent may not have another child."""
    budget = parent.budget
    if budget.max_children is not None and len(parent.children) >= budget.max_children:
        raise ResourceExhausted(
            f"handle {parent.id!r} has spawned {len(parent.children)} of its max_children {budget.max_children}",
            reason=Limit.MAX_CHILDREN.wire_name,
            limit=Limit.MAX_CHILDREN,
        )
    if budget.max_depth is not None and budget.max_depth <= 0:
        raise ResourceExhausted(
            f"handle {parent.id!r} is at its max_depth: it may not delegate further",
            reason=Limit.MAX_DEPTH.wire_name,
            limit=Limit.MAX_DEPTH,
        )
