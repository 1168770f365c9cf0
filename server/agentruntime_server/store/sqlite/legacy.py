"""Reads the tables of a store written by release 0.1.0 (before the journal) as journal
steps: migration 3 turns each runtime's rows into one Spawned and one Imported step per
handle, an Answered step per answer, and its events into one EventsImported step."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ...domain.billing.usage import Usage
from ...domain.journal import Answered, Entry, EventsImported, Imported, Spawned, Step
from ...domain.vocabulary import (
    Answer,
    Budget,
    HandleState,
    InboxItem,
    Limit,
    Message,
    PendingRequest,
    Status,
    TaskResult,
    ToolCall,
    ToolOutput,
    ToolResult,
)
from ...domain.watching.event_log import Event, EventKind


def _json(raw: bytes | str | None) -> Any:
    return json.loads(raw) if raw else None


def _call(data: dict[str, Any]) -> ToolCall:
    return ToolCall(id=data["id"], name=data["name"], arguments_json=data["arguments_json"])


def _pending(data: dict[str, Any] | None) -> PendingRequest | None:
    if data is None:
        return None
    return PendingRequest(
        id=data["id"],
        kind=data["kind"],
        prompt=data["prompt"],
        url=data["url"],
        data=data["data"],
        path=tuple(data["path"]),
        calls=tuple((_call(call), key) for call, key in data["calls"]),
    )


def _result(data: dict[str, Any] | None) -> TaskResult | None:
    if data is None:
        return None
    return TaskResult(
        handle_id=data["handle_id"],
        text=data["text"],
        is_error=data["is_error"],
        status=Status(data["status"]),
        limit=Limit(data["limit"]),
        pending=_pending(data["pending"]),
        usage=Usage.unsplit(data["turns"], data["own_tokens"], data["total_tokens"], data["tool_calls"]),
    )


def _event(data: dict[str, Any]) -> Event:
    return Event(
        seq=data["seq"],
        time=data["time"],
        handle_id=data["handle_id"],
        kind=EventKind(data["kind"]),
        parent_id=data["parent_id"],
        agent=data["agent"],
        state=HandleState(data["state"]) if data["state"] is not None else None,
        turn=data["turn"],
        tokens=data["tokens"],
        own_tokens=data["own_tokens"],
        total_tokens=data["total_tokens"],
        tool_calls=data["tool_calls"],
        call=_call(data["call"]) if data["call"] else None,
        call_id=data["call_id"],
        output=data["output"],
        is_error=data["is_error"],
        pending=_pending(data["pending"]),
        result=_result(data["result"]),
    )


def _answer(data: dict[str, Any]) -> Answer:
    return Answer(
        id=data["id"],
        ok=data["ok"],
        data=data["data"],
        reason=data["reason"],
        outputs=tuple(ToolOutput(o["call_id"], o["output"], o["is_error"]) for o in data["outputs"]),
    )


def runtime_steps(db: sqlite3.Connection, runtime_id: str) -> list[Step]:
    """One runtime of a 0.1.0 store, as the steps that rebuild it."""
    steps: list[Step] = []
    transcripts: dict[str, list[Message]] = {}
    for handle_id, role, content, calls, call_id, is_error, turn in db.execute(
        "SELECT handle_id, role, content, tool_calls, tool_call_id, is_error, turn FROM messages "
        "WHERE runtime_id = ? ORDER BY handle_id, idx",
        (runtime_id,),
    ):
        tool_calls = tuple(_call(call) for call in _json(calls) or ())
        transcripts.setdefault(handle_id, []).append(Message(role, content, tool_calls, call_id, bool(is_error), turn))
    results: dict[str, dict[str, ToolResult]] = {}
    for handle_id, call_id, output, is_error in db.execute(
        "SELECT handle_id, call_id, output, is_error FROM tool_results WHERE runtime_id = ?", (runtime_id,)
    ):
        results.setdefault(handle_id, {})[call_id] = ToolResult(output, bool(is_error))
    started: dict[str, list[str]] = {}
    for handle_id, call_id in db.execute("SELECT handle_id, call_id FROM started_calls WHERE runtime_id = ?", (runtime_id,)):
        started.setdefault(handle_id, []).append(call_id)
    for row in db.execute(
        "SELECT handle_id, parent_id, agent, child_key, state, turns, own_tokens, total_tokens, tool_calls, "
        "subtree_tool_calls, budget, inbox, last_result, pending, approved, in_doubt FROM handles "
        "WHERE runtime_id = ? ORDER BY seq",
        (runtime_id,),
    ):
        (handle_id, parent_id, agent, child_key, state, turns, own, total, calls, subtree_calls) = row[:10]
        budget, inbox, last_result, pending, approved, in_doubt = row[10:]
        number = int(handle_id.rsplit(".", 1)[1])
        steps.append(Spawned(handle_id, parent_id, agent, Budget(**_json(budget)), child_key, number))
        steps.append(
            Imported(
                handle_id=handle_id,
                usage=Usage.unsplit(turns, own, total, calls, subtree_calls),
                state=HandleState(state),
                inbox=tuple(InboxItem(**item) for item in _json(inbox) or ()),
                transcript=tuple(transcripts.get(handle_id, ())),
                tool_results=results.get(handle_id, {}),
                started=tuple(sorted(started.get(handle_id, ()))),
                last_result=_result(_json(last_result)),
                pending=_pending(_json(pending)),
                approved=tuple(_json(approved) or ()),
                in_doubt=tuple(_json(in_doubt) or ()),
            )
        )
    for request_id, answer, leaf_id in db.execute(
        "SELECT request_id, answer, leaf_id FROM answers WHERE runtime_id = ? ORDER BY request_id", (runtime_id,)
    ):
        steps.append(Answered(request_id, _answer(_json(answer)), leaf_id))
    events = tuple(
        _event(_json(raw)) for (raw,) in db.execute("SELECT event FROM events WHERE runtime_id = ? ORDER BY seq", (runtime_id,))
    )
    if events:
        steps.append(EventsImported(events))
    return steps


def runtime_entries(db: sqlite3.Connection, runtime_id: str, at: float) -> list[Entry]:
    entries = []
    for seq, step in enumerate(runtime_steps(db, runtime_id), start=1):
        if isinstance(step, EventsImported):
            entries.append(Entry(seq, at, step.kept[0].seq, len(step.kept), step))
        else:
            entries.append(Entry(seq, at, 1, 0, step))
    return entries
