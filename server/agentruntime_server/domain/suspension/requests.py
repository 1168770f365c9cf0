"""The Requests a handle presents to its host when a run cannot go on without it: calls for
the host to run (relay), approvals, questions, calls in doubt, a tool's own Request (HTTP 202),
a budget that asks to be extended. Their ids are derived from the journal, so a re-entered
turn asks with the same id."""

from __future__ import annotations

import json
from collections.abc import Container
from typing import Any

from ..journal.handle import Handle
from ..vocabulary import Limit, PendingRequest, ToolCall, ToolSuspension


def idempotency_key(runtime_key: str, handle: Handle, call: ToolCall) -> str:
    return f"{runtime_key}/{handle.id}/{call.id}"


def own_request(runtime_key: str, answered: Container[str], handle: Handle, kind: str, calls: list[ToolCall]) -> PendingRequest:
    """`answered`: the ids of the runtime's Requests answered so far."""
    keyed = tuple((call, idempotency_key(runtime_key, handle, call)) for call in calls)
    first = calls[0]
    data: dict[str, Any] = {
        "calls": [
            {"id": call.id, "name": call.name, "arguments_json": call.arguments_json, "idempotency_key": key}
            for call, key in keyed
        ]
    }
    prompt = ""
    if kind == "approval":
        spec = handle.agent.tool(first.name)
        rail = handle.agent.guardrail(first.name)
        prompt = (spec.approval_prompt if spec else "") or (rail.reason if rail else "") or f"Allow {first.name}?"
        prompt = f"{prompt} ({first.name} {first.arguments_json})"
    elif kind == "input":
        prompt = _question(first)
    elif kind == "tool_call":
        prompt = f"Run {', '.join(call.name for call in calls)} and Resume with one output per call"
    elif kind == "in_doubt":
        prompt = (
            f"{first.name} {first.arguments_json} was cut off before it answered (the server stopped, its "
            "worker went away, or the connection to its endpoint was lost after the request was sent) and "
            "may or may not have taken effect: answer ok with an output to use "
            "it, ok without one to run it again, "
            "or not ok to fail the call"
        )
    # The kind is part of the id: one call can ask twice (approval, then its relay output).
    request_id = f"{handle.id}/{first.id}:{kind}"
    if kind == "in_doubt":
        # In doubt again after the host had it run again: a Request of its own, lest a retry
        # of the Resume that answered the last one be read as an answer to this one.
        again = 1
        while request_id in answered:
            again += 1
            request_id = f"{handle.id}/{first.id}:in_doubt.{again}"
    return PendingRequest(id=request_id, kind=kind, prompt=prompt, data=data, path=handle.path, calls=keyed)


def tool_request(runtime_key: str, handle: Handle, call: ToolCall, asked: ToolSuspension) -> PendingRequest:
    """The Request a running tool asked for (HTTP 202); answered, the tool is called again."""
    rounds = handle.tool_rounds.get(call.id, 1)
    return PendingRequest(
        id=f"{handle.id}/{call.id}:{asked.kind}.{rounds}",
        kind=asked.kind,
        prompt=asked.prompt or f"{call.name} needs the host ({asked.kind})",
        url=asked.url,
        data=dict(asked.data),
        path=handle.path,
        calls=((call, idempotency_key(runtime_key, handle, call)),),
        expires_at=asked.expires_at,
        from_tool=True,
    )


def budget_request(handle: Handle, limit: Limit, reserved: int | None = None) -> PendingRequest:
    """A budget that asks (ON_EXHAUSTED_ASK): the host may extend it. The id names the limit,
    the figure and the cap, so a re-entered turn asks with the same id, and a new ask after
    an extension gets a new one. `reserved`: the budget is not used up, but the next turn's
    reservation (reservations.py) does not fit in what is left."""
    usage, budget = handle.usage, handle.budget
    figure, cap = {
        Limit.MAX_TURNS: (usage.turns, budget.max_turns),
        Limit.MAX_TOKENS: (usage.total_tokens, budget.max_tokens),
        Limit.MAX_TOOL_CALLS: (usage.subtree_tool_calls, budget.max_tool_calls),
        Limit.MAX_COST: (usage.total_cost.micros, budget.max_cost),
    }[limit]
    field = {
        Limit.MAX_TURNS: "max_turns",
        Limit.MAX_TOKENS: "max_tokens",
        Limit.MAX_TOOL_CALLS: "max_tool_calls",
        Limit.MAX_COST: "max_cost",
    }[limit]
    data = {
        "limit": limit.wire_name,
        "field": field,
        "used": figure,
        "budget": cap,
        "usage": {
            "turns": usage.turns,
            "own_tokens": usage.own_tokens,
            "total_tokens": usage.total_tokens,
            "tool_calls": usage.tool_calls,
            "total_cost_micros": usage.total_cost.micros,
        },
    }
    reached = f"reached {limit.wire_name} ({figure} of {cap})"
    if reserved is not None:
        data["reserved"] = reserved
        reached = f"cannot start its next turn, reserved {reserved}, within {limit.wire_name} ({figure} of {cap} used)"
    prompt = (
        f"{handle.id} {reached}: Resume with ok and "
        f'data {{"extend": {{"{field}": <a higher value>}}}} to raise it and go on, or not ok to stop'
    )
    return PendingRequest(
        id=f"{handle.id}/budget:{limit.wire_name}@{figure}/{cap}", kind="budget", prompt=prompt, data=data, path=handle.path
    )


def _question(call: ToolCall) -> str:
    try:
        arguments = json.loads(call.arguments_json)
    except ValueError:
        return call.arguments_json
    question = arguments.get("question") if isinstance(arguments, dict) else None
    return str(question) if question else call.arguments_json
