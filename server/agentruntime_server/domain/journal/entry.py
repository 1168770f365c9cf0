"""A journaled step, as the store keeps it, and the events a watcher sees of it."""

from __future__ import annotations

from dataclasses import dataclass

from .events import Event
from .imported import EventsImported
from .steps import Step


@dataclass(frozen=True)
class Entry:
    """One journaled step: its place in the runtime's journal, when it was recorded, and the
    numbers of the events it made (first_event .. first_event + event_count - 1)."""

    seq: int
    at: float
    first_event: int
    event_count: int
    step: Step

    @property
    def last_event(self) -> int:
        return self.first_event + self.event_count - 1


def events_of(entry: Entry) -> list[Event]:
    """The events a watcher sees for one journaled step."""
    step = entry.step
    if isinstance(step, EventsImported):
        return list(step.kept)
    return [
        Event(seq=entry.first_event + index, time=entry.at, handle_id=handle_id, kind=kind, **fields)  # type: ignore[arg-type]
        for index, (handle_id, kind, fields) in enumerate(step.events())
    ]
