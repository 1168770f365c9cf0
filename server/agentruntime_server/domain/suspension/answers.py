"""What an Answer means for the Request it answers."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import FieldViolation, InvalidArgument, shown
from ..limits import Limits
from ..vocabulary import Answer, PendingRequest, ToolResult


@dataclass(frozen=True)
class AnswerOutcome:
    results: list[tuple[str, ToolResult]]  # call id -> the result to journal
    approved: list[str] = field(default_factory=list)  # call ids that may run now, once
    rerun: list[str] = field(default_factory=list)  # in-doubt call ids to run again
    extend: dict[str, Any] | None = None  # a `budget` Request: the budget fields raised
    declined: bool = False  # a `budget` Request: the host said stop
    for_tool: list[str] = field(default_factory=list)  # calls to make again, with the answer


MAX_TOOL_ANSWER_BYTES = 4096  # the answer a suspending tool gets back travels in a header


# The Budget fields a `budget` Answer may extend, and the least each may be.
EXTENDABLE = {
    "max_turns": 0,
    "max_tokens": 0,
    "max_tool_calls": 0,
    "max_children": 0,
    "max_depth": 0,
    "max_concurrent": 1,
    "max_cost": 0,
}


def read_answer(request: PendingRequest, answer: Answer, bounds: Limits, now: float) -> AnswerOutcome:
    """What the answer means for the request (`now`: the clock's time, for a tool's expiry)."""
    _check_sizes(answer, bounds)
    if not answer.ok and answer.outputs:
        raise InvalidArgument(
            [FieldViolation("answer.outputs", "a declining answer (ok false) carries no outputs: set ok, or drop the outputs")]
        )
    call_ids = [call.id for call, _ in request.calls]
    if request.from_tool:
        return _tool_answer(request, call_ids[0], answer, now)
    if request.kind == "budget":
        return _budget(answer)
    if request.kind == "tool_call":
        return _relay(call_ids, answer)
    if request.kind == "in_doubt":
        return _in_doubt(call_ids[0], answer)
    if answer.outputs:
        raise InvalidArgument(
            [FieldViolation("answer.outputs", f"a {request.kind!r} request takes ok/data/reason, not tool outputs")]
        )
    [call_id] = call_ids
    if request.kind == "approval":
        if answer.ok:
            return AnswerOutcome(results=[], approved=[call_id])
        declined = ToolResult(f"declined by the host: {answer.reason or 'no reason given'}", is_error=True)
        return AnswerOutcome(results=[(call_id, declined)])
    # input (the ask tool): the answer's data is the result
    if not answer.ok:
        return AnswerOutcome([(call_id, ToolResult(f"the host did not answer: {answer.reason or 'no reason given'}", True))])
    output = json.dumps(answer.data, sort_keys=True) if answer.data else answer.reason
    return AnswerOutcome(results=[(call_id, ToolResult(output))])


def _check_sizes(answer: Answer, bounds: Limits) -> None:
    violations = []
    for index, output in enumerate(answer.outputs):
        if len(output.output.encode()) > bounds.max_text_bytes:
            violations.append(FieldViolation(f"answer.outputs[{index}].output", f"is longer than {bounds.max_text_bytes} bytes"))
    if len(answer.reason.encode()) > bounds.max_text_bytes:
        violations.append(FieldViolation("answer.reason", f"is longer than {bounds.max_text_bytes} bytes"))
    if answer.data and len(json.dumps(answer.data).encode()) > bounds.max_text_bytes:
        violations.append(FieldViolation("answer.data", f"is longer than {bounds.max_text_bytes} bytes as JSON"))
    if violations:
        raise InvalidArgument(violations)


def tool_answer_header(answer: Answer) -> str:
    """How a suspending tool gets the host's answer: compact ASCII JSON in a header."""
    return json.dumps({"id": answer.id, "ok": answer.ok, "data": answer.data, "reason": answer.reason}, separators=(",", ":"))


def _tool_answer(request: PendingRequest, call_id: str, answer: Answer, now: float) -> AnswerOutcome:
    if answer.outputs:
        raise InvalidArgument(
            [FieldViolation("answer.outputs", f"a {request.kind!r} request of a tool takes ok, data and reason, not outputs")]
        )
    if request.expires_at is not None and now >= request.expires_at:
        when = datetime.datetime.fromtimestamp(request.expires_at, datetime.UTC).isoformat(timespec="seconds")
        return AnswerOutcome([(call_id, ToolResult(f"the pending {request.kind} request expired at {when}", True))])
    if not answer.ok:
        return AnswerOutcome([(call_id, ToolResult(f"declined by the host: {answer.reason or 'no reason given'}", True))])
    if len(tool_answer_header(answer)) > MAX_TOOL_ANSWER_BYTES:
        raise InvalidArgument(
            [FieldViolation("answer.data", f"a tool's answer travels in a header: at most {MAX_TOOL_ANSWER_BYTES} bytes as JSON")]
        )
    return AnswerOutcome(results=[], for_tool=[call_id])


def _budget(answer: Answer) -> AnswerOutcome:
    if answer.outputs:
        raise InvalidArgument([FieldViolation("answer.outputs", "a 'budget' request takes ok and data.extend, not tool outputs")])
    if not answer.ok:
        return AnswerOutcome(results=[], declined=True)
    extend = answer.data.get("extend")
    if not isinstance(extend, dict) or not extend:
        raise InvalidArgument(
            [FieldViolation("answer.data.extend", 'give the budget fields to raise, e.g. {"extend": {"max_turns": 20}}')]
        )
    fields: dict[str, Any] = {}
    violations = []
    for name, value in extend.items():
        least = EXTENDABLE.get(name)
        if least is None:
            violations.append(FieldViolation(f"answer.data.extend.{name[:40]}", f"not a budget field: {sorted(EXTENDABLE)}"))
        elif not isinstance(value, int | float) or isinstance(value, bool) or value != int(value) or not least <= value < 2**62:
            violations.append(FieldViolation(f"answer.data.extend.{name}", f"must be a whole number >= {least}"))
        else:
            fields[name] = int(value)
    if violations:
        raise InvalidArgument(violations)
    return AnswerOutcome(results=[], extend=fields)


def _relay(call_ids: list[str], answer: Answer) -> AnswerOutcome:
    violations = []
    seen: set[str] = set()
    for index, output in enumerate(answer.outputs):
        if output.call_id not in call_ids:
            violations.append(
                FieldViolation(
                    f"answer.outputs[{index}].call_id", f"{shown(output.call_id)} is not one of the request's calls {call_ids}"
                )
            )
        elif output.call_id in seen:
            violations.append(FieldViolation(f"answer.outputs[{index}].call_id", f"{shown(output.call_id)} is answered twice"))
        seen.add(output.call_id)
    if violations:
        raise InvalidArgument(violations)
    given = {output.call_id: output for output in answer.outputs}
    results = []
    for call_id in call_ids:
        given_output = given.get(call_id)
        if given_output is not None:
            results.append((call_id, ToolResult(given_output.output, given_output.is_error)))
        elif not answer.ok and not answer.outputs:
            results.append((call_id, ToolResult(f"declined by the host: {answer.reason or 'no reason given'}", is_error=True)))
        else:
            results.append((call_id, ToolResult("the host returned no output for this call", is_error=True)))
    return AnswerOutcome(results=results)


def _in_doubt(call_id: str, answer: Answer) -> AnswerOutcome:
    if len(answer.outputs) > 1 or any(output.call_id not in ("", call_id) for output in answer.outputs):
        raise InvalidArgument(
            [FieldViolation("answer.outputs", f"an in_doubt request takes at most one output, for call {call_id!r}")]
        )
    if not answer.ok:
        failed = ToolResult(f"failed by the host (it was in doubt): {answer.reason or 'no reason given'}", is_error=True)
        return AnswerOutcome(results=[(call_id, failed)])
    if answer.outputs:
        output = answer.outputs[0]
        return AnswerOutcome(results=[(call_id, ToolResult(output.output, output.is_error))])
    return AnswerOutcome(results=[], rerun=[call_id])
