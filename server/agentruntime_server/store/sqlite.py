"""`sqlite:///path`: the durable default. WAL mode, one writer (this process), one
transaction per journal step together with its usage roll-up.

Each message and journal entry is stored once, keyed by its position: a model call's
prompt is the transcript so far, never a new copy of it, so storage grows with the
transcript and not with its square. Calls run on the event loop thread: every write is
a short local transaction and no await happens inside one, so writes are atomic with
respect to the runtime's in-memory state."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from ..domain.events import Event
from ..domain.model import (
    AgentSpec,
    Answer,
    Budget,
    HandleRecord,
    HandleState,
    InboxItem,
    Message,
    PendingRequest,
    RuntimeRecord,
    TaskResult,
    ToolCall,
    ToolResult,
)
from ..domain.ports import Figures
from .migrations import migrate

_AGENTS = TypeAdapter(tuple[AgentSpec, ...])
_BUDGET = TypeAdapter(Budget)
_INBOX = TypeAdapter(tuple[InboxItem, ...])
_RESULT = TypeAdapter(TaskResult | None)
_PENDING = TypeAdapter(PendingRequest | None)
_CALLS = TypeAdapter(tuple[ToolCall, ...])
_IDS = TypeAdapter(tuple[str, ...])
_ANSWER = TypeAdapter(Answer)
_EVENT = TypeAdapter(Event)

_HANDLE_COLUMNS = (
    "runtime_id, handle_id, seq, parent_id, agent, child_key, state, turns, own_tokens, total_tokens, "
    "tool_calls, subtree_tool_calls, budget, inbox, last_result, pending, approved, in_doubt"
)
_SAVE_HANDLE = f"INSERT OR REPLACE INTO handles ({_HANDLE_COLUMNS}) VALUES ({', '.join('?' * 18)})"
_APPEND_MESSAGE = (
    "INSERT OR REPLACE INTO messages (runtime_id, handle_id, idx, role, content, tool_calls, tool_call_id, is_error, turn) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_UPDATE_FIGURES = (
    "UPDATE handles SET turns = ?, own_tokens = ?, total_tokens = ?, tool_calls = ?, subtree_tool_calls = ? "
    "WHERE runtime_id = ? AND handle_id = ?"
)
_TRUNCATE = "DELETE FROM messages WHERE runtime_id = ? AND handle_id = ? AND idx >= ?"


class SqliteStore:
    durable = True

    def __init__(self, path: str) -> None:
        if path != ":memory:":
            _create_private(Path(path))
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a committed write survives a process crash
        self._db.execute("PRAGMA busy_timeout=5000")
        migrate(self._db)
        self._open = False
        self._events: list[tuple[str, int, bytes]] = []  # written in one statement at commit

    # Group commit: the writes made in one event-loop tick share one transaction, committed
    # when the tick ends, or at once by flush(). flush() runs before anything leaves the
    # process that a lost write would make wrong: an RPC's acknowledgement, a side-effecting
    # tool call. A crash can only lose writes whose effects have not left the process yet,
    # which replay and the in-doubt rules already treat as in flight.

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if not self._open:
            self._db.execute("BEGIN IMMEDIATE")
            self._open = True
            try:
                asyncio.get_running_loop().call_soon(self._commit)
            except RuntimeError:  # no event loop (a tool or a test): commit when the write ends
                yield self._db
                self._commit()
                return
        # One write that fails leaves no trace and takes no other write of the tick with it:
        # the tick's transaction holds other runtimes' writes too.
        self._db.execute("SAVEPOINT write")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK TO write")
            raise
        finally:
            self._db.execute("RELEASE write")

    def _commit(self) -> None:
        if self._open:
            self._write_events()
            self._open = False
            self._db.execute("COMMIT")

    async def flush(self) -> None:
        self._commit()

    # ---- writes --------------------------------------------------------------------------

    async def create_runtime(self, runtime_id: str, agents: tuple[AgentSpec, ...]) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO runtimes (id, agents, created_at) VALUES (?, ?, ?)",
                (runtime_id, _AGENTS.dump_json(agents), time.time()),
            )

    async def runtime_exists(self, runtime_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM runtimes WHERE id = ?", (runtime_id,)).fetchone() is not None

    async def save_handles(self, runtime_id: str, records: list[HandleRecord]) -> None:
        with self._transaction() as db:
            db.executemany(_SAVE_HANDLE, [_handle_row(runtime_id, record) for record in records])

    async def append_messages(
        self, runtime_id: str, handle_id: str, start: int, messages: list[Message], record: HandleRecord | None = None
    ) -> None:
        with self._transaction() as db:
            db.execute(_TRUNCATE, (runtime_id, handle_id, start))
            db.executemany(
                _APPEND_MESSAGE, [_message_row(runtime_id, handle_id, start + i, message) for i, message in enumerate(messages)]
            )
            if record is not None:
                db.execute(_SAVE_HANDLE, _handle_row(runtime_id, record))

    async def truncate_transcript(self, runtime_id: str, handle_id: str, length: int) -> None:
        with self._transaction() as db:
            db.execute(_TRUNCATE, (runtime_id, handle_id, length))

    async def record_model_reply(
        self, runtime_id: str, handle_id: str, index: int, message: Message, figures: list[Figures]
    ) -> None:
        with self._transaction() as db:
            db.execute(_APPEND_MESSAGE, _message_row(runtime_id, handle_id, index, message))
            db.executemany(_UPDATE_FIGURES, [(*figure[1:], runtime_id, figure[0]) for figure in figures])

    async def record_call_started(self, runtime_id: str, handle_id: str, call_id: str) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO started_calls (runtime_id, handle_id, call_id) VALUES (?, ?, ?)",
                (runtime_id, handle_id, call_id),
            )
        self._commit()  # the call leaves the process next: it must be known to have started

    async def record_tool_result(
        self, runtime_id: str, handle_id: str, call_id: str, result: ToolResult, figures: list[Figures]
    ) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO tool_results (runtime_id, handle_id, call_id, output, is_error) VALUES (?, ?, ?, ?, ?)",
                (runtime_id, handle_id, call_id, result.output, result.is_error),
            )
            db.execute(
                "DELETE FROM started_calls WHERE runtime_id = ? AND handle_id = ? AND call_id = ?",
                (runtime_id, handle_id, call_id),
            )
            db.executemany(_UPDATE_FIGURES, [(*figure[1:], runtime_id, figure[0]) for figure in figures])

    async def record_answer(self, runtime_id: str, request_id: str, answer: Answer, leaf_id: str) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO answers (runtime_id, request_id, answer, leaf_id) VALUES (?, ?, ?, ?)",
                (runtime_id, request_id, _ANSWER.dump_json(answer), leaf_id),
            )

    # ---- reads ---------------------------------------------------------------------------

    async def append_event(self, runtime_id: str, event: Event) -> None:
        with self._transaction():
            self._events.append((runtime_id, event.seq, _EVENT.dump_json(event)))

    def _write_events(self) -> None:
        if self._events:
            self._db.executemany("INSERT INTO events (runtime_id, seq, event) VALUES (?, ?, ?)", self._events)
            self._events.clear()

    async def events_after(self, runtime_id: str, after_seq: int) -> list[Event]:
        self._write_events()
        rows = self._db.execute("SELECT event FROM events WHERE runtime_id = ? AND seq > ? ORDER BY seq", (runtime_id, after_seq))
        return [_EVENT.validate_json(row[0]) for row in rows]

    async def load_runtime(self, runtime_id: str) -> RuntimeRecord | None:
        db = self._db
        row = db.execute("SELECT agents FROM runtimes WHERE id = ?", (runtime_id,)).fetchone()
        if row is None:
            return None
        record = RuntimeRecord(
            runtime_id=runtime_id,
            agents=_AGENTS.validate_json(row[0]),
            handles=[
                _handle_record(values)
                for values in db.execute(
                    f"SELECT {_HANDLE_COLUMNS} FROM handles WHERE runtime_id = ? ORDER BY seq", (runtime_id,)
                )
            ],
            transcripts={},
            tool_results={},
            started_calls={},
            answered={},
        )
        for handle_id, role, content, calls, call_id, is_error, turn in db.execute(
            "SELECT handle_id, role, content, tool_calls, tool_call_id, is_error, turn FROM messages "
            "WHERE runtime_id = ? ORDER BY handle_id, idx",
            (runtime_id,),
        ):
            message = Message(role, content, _CALLS.validate_json(calls) if calls else (), call_id, bool(is_error), turn)
            record.transcripts.setdefault(handle_id, []).append(message)
        for handle_id, call_id, output, is_error in db.execute(
            "SELECT handle_id, call_id, output, is_error FROM tool_results WHERE runtime_id = ?", (runtime_id,)
        ):
            record.tool_results.setdefault(handle_id, {})[call_id] = ToolResult(output, bool(is_error))
        for handle_id, call_id in db.execute("SELECT handle_id, call_id FROM started_calls WHERE runtime_id = ?", (runtime_id,)):
            record.started_calls.setdefault(handle_id, set()).add(call_id)
        for request_id, answer, leaf_id in db.execute(
            "SELECT request_id, answer, leaf_id FROM answers WHERE runtime_id = ?", (runtime_id,)
        ):
            record.answered[request_id] = (_ANSWER.validate_json(answer), leaf_id)
        self._write_events()
        last = db.execute("SELECT MAX(seq) FROM events WHERE runtime_id = ?", (runtime_id,)).fetchone()[0]
        record.last_event_seq = last or 0
        return record

    async def runtimes_with_running_handles(self) -> list[str]:
        rows = self._db.execute(
            "SELECT DISTINCT runtime_id FROM handles WHERE state = ? ORDER BY runtime_id", (HandleState.RUNNING.value,)
        )
        return [runtime_id for (runtime_id,) in rows]

    async def close(self) -> None:
        self._commit()
        self._db.close()


def _create_private(path: Path) -> None:
    """The store holds tool header values (secrets) and every transcript: a directory it
    creates is owner-only (0700), and so is the file (0600). SQLite gives its -wal and -shm
    files the database file's mode."""
    directory = path.parent.absolute()
    for ancestor in [*reversed(directory.parents), directory]:
        if not ancestor.exists():
            ancestor.mkdir(mode=0o700, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def _handle_row(runtime_id: str, record: HandleRecord) -> tuple[Any, ...]:
    return (
        runtime_id,
        record.handle_id,
        record.seq,
        record.parent_id,
        record.agent,
        record.child_key,
        record.state.value,
        record.turns,
        record.own_tokens,
        record.total_tokens,
        record.tool_calls,
        record.subtree_tool_calls,
        _BUDGET.dump_json(record.budget),
        _INBOX.dump_json(record.inbox) if record.inbox else None,
        _RESULT.dump_json(record.last_result) if record.last_result else None,
        _PENDING.dump_json(record.pending) if record.pending else None,
        _IDS.dump_json(record.approved) if record.approved else None,
        _IDS.dump_json(record.in_doubt) if record.in_doubt else None,
    )


def _handle_record(values: tuple[Any, ...]) -> HandleRecord:
    (_, handle_id, seq, parent_id, agent, child_key, state, turns, own, total, calls, subtree_calls) = values[:12]
    budget, inbox, last_result, pending, approved, in_doubt = values[12:]
    return HandleRecord(
        handle_id=handle_id,
        parent_id=parent_id,
        agent=agent,
        budget=_BUDGET.validate_json(budget),
        child_key=child_key,
        seq=seq,
        state=HandleState(state),
        turns=turns,
        own_tokens=own,
        total_tokens=total,
        tool_calls=calls,
        subtree_tool_calls=subtree_calls,
        inbox=_INBOX.validate_json(inbox) if inbox else (),
        last_result=_RESULT.validate_json(last_result) if last_result else None,
        pending=_PENDING.validate_json(pending) if pending else None,
        approved=_IDS.validate_json(approved) if approved else (),
        in_doubt=_IDS.validate_json(in_doubt) if in_doubt else (),
    )


def _message_row(runtime_id: str, handle_id: str, index: int, message: Message) -> tuple[Any, ...]:
    calls = _CALLS.dump_json(message.tool_calls) if message.tool_calls else None
    return (
        runtime_id,
        handle_id,
        index,
        message.role,
        message.content,
        calls,
        message.tool_call_id,
        message.is_error,
        message.turn,
    )
