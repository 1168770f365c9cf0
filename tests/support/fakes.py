"""Fakes of the domain's ports, for tests that drive the domain directly: no gRPC, no store
adapter, no process. A store that keeps what a journal appends (or refuses it when told), and
a journal over it that reads time from a clock the test moves by hand (tests/support/clock.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentruntime_server.domain.clock import Clock
from agentruntime_server.domain.journal import Entry, Journal, Tree
from agentruntime_server.domain.vocabulary import AgentSpec
from agentruntime_server.domain.watching.event_log import Event, EventLog

from tests.support.clock import FakeClock


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
    agents: Sequence[AgentSpec], runtime_id: str = "rt", store: JournalStore | None = None, clock: Clock | None = None
) -> tuple[Journal, list[Event]]:
    """A journal of a fresh runtime over a JournalStore, its times read from `clock` (a FakeClock
    of its own when none is given: never the machine's); the events it tells its observer, live."""
    clock = clock or FakeClock()
    told: list[Event] = []
    events = EventLog(runtime_id, no_history, observers=(lambda _, event: told.append(event),), clock=clock)
    return Journal(Tree(runtime_id, tuple(agents)), store or JournalStore(), events, clock=clock), told
