"""Fakes of the domain's ports, for tests that drive the domain directly: no gRPC, no store
adapter, no process. A store that keeps what a journal appends (or refuses it when told), a
journal over it, and a clock a test moves by hand."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from agentruntime_server.domain.journal import Entry, Journal, Tree
from agentruntime_server.domain.vocabulary import AgentSpec
from agentruntime_server.domain.watching.event_log import Event, EventLog


class JournalStore:
    """The Store port as a Journal uses it: each append kept in order, or refused with `refusal`."""

    def __init__(self) -> None:
        self.entries: dict[str, list[Entry]] = {}
        self.refusal: Exception | None = None

    async def append(self, runtime_id: str, entries: Sequence[Entry], running: bool | None = None, counts: Any = None) -> None:
        if self.refusal is not None:
            raise self.refusal
        self.entries.setdefault(runtime_id, []).extend(entries)


async def no_history(after: int, limit: int) -> list[Event]:
    return []


def journal(
    agents: Sequence[AgentSpec], runtime_id: str = "rt", store: JournalStore | None = None
) -> tuple[Journal, list[Event]]:
    """A journal of a fresh runtime over a JournalStore; the events it tells its observer, live."""
    told: list[Event] = []
    events = EventLog(runtime_id, no_history, observers=(lambda _, event: told.append(event),))
    return Journal(Tree(runtime_id, tuple(agents)), store or JournalStore(), events), told


class Clock:
    """time.time and time.monotonic, moved by the test (`advance`) rather than by time."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A Clock standing in for the time module's clocks: for synchronous tests only (an event
    loop would read it too)."""
    made = Clock()
    monkeypatch.setattr(time, "time", made.time)
    monkeypatch.setattr(time, "monotonic", made.monotonic)
    return made
