"""What a watcher sees: the events a journaled step yields (steps.py names them, entry.py
numbers them). Values only: the log that hands them to watchers is domain/watching/event_log.py."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from ..billing.usage import Cost, Tokens, Usage
from ..vocabulary import HandleState, PendingRequest, TaskResult, ToolCall


class EventKind(enum.Enum):
    SPAWNED = 1
    STATE_CHANGED = 2
    TURN_STARTED = 3
    TURN_ENDED = 4
    TOOL_CALL_STARTED = 5
    TOOL_CALL_ENDED = 6
    PENDING = 7
    RESULT = 8
    # Told to observers only, never stored or watched: the runtime left this process (deleted,
    # its lease moved, a shutdown), so what an observer holds of it must go.
    RUNTIME_GONE = 9


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    handle_id: str
    kind: EventKind
    parent_id: str = ""
    agent: str = ""
    state: HandleState | None = None
    turn: int = 0
    tokens: int = 0
    own_tokens: int = 0
    total_tokens: int = 0
    tool_calls: int = 0
    usage_estimated: bool = False
    split: Tokens | None = None  # TURN_ENDED: the reply's usage as the provider bills it
    cost: Cost | None = None  # TURN_ENDED: what the reply cost
    usage: Usage | None = None  # TURN_ENDED: the handle's figures after it
    call: ToolCall | None = None
    call_id: str = ""
    output: str = ""
    is_error: bool = False
    pending: PendingRequest | None = None
    result: TaskResult | None = None


# Called synchronously with every event once it is persisted (metrics, logs, traces), and
# with RUNTIME_GONE when the log closes. An observer must be quick and must not raise.
Observer = Callable[[str, Event], None]
