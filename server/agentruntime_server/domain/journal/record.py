"""The journal: steps recorded as they happen, applied to the in-memory tree and appended
to the store together, then told to whoever listens. The store and the listeners are the
journal's only I/O, and both are handed in (ports.Store and events.EventLog are them)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import DomainError, Fenced, NotFound, NotJournaled
from .entry import Entry
from .events import Event, EventKind
from .replay import apply, replay
from .steps import Step
from .tree import RuntimeCounts, Tree

log = logging.getLogger("agentruntime_server.domain.journal")


_Made = tuple[int, str, EventKind, dict[str, object]]  # an event of a step recorded: (seq, handle, kind, fields)


class JournalStore(Protocol):
    """What the journal needs of a store (ports.Store, which says what `append` promises)."""

    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: RuntimeCounts | None = None,
    ) -> None: ...


class EventSink(Protocol):
    """Who takes the events of the steps recorded (events.EventLog): they are numbered on from
    its `last_seq`, and built and published only when someone `listened`."""

    last_seq: int

    @property
    def listened(self) -> bool: ...

    def publish(self, events: list[Event]) -> None: ...


@dataclass
class Journal:
    """Records steps: applied to the tree, appended to the store, then told to watchers."""

    tree: Tree
    store: JournalStore
    events: EventSink
    last_seq: int = 0
    clock: Clock = SYSTEM_CLOCK
    closed: bool = field(default=False, init=False)
    deleted: bool = field(default=False, init=False)  # closed as its runtime is deleted: a write gets NotFound
    _was_running: bool = field(default=False, init=False)
    _counts: RuntimeCounts | None = field(default=None, init=False)

    @classmethod
    def restore(
        cls, tree: Tree, store: JournalStore, events: EventSink, entries: Sequence[Entry], clock: Clock = SYSTEM_CLOCK
    ) -> Journal:
        replay(tree, entries)
        journal = cls(tree, store, events, entries[-1].seq if entries else 0, clock)
        events.last_seq = max((entry.last_event for entry in entries), default=0)
        journal._was_running = tree.active
        # (_counts stays None: the first write after a load stores the figures whole, which
        # fills in those a store row from before a figure existed lacks)
        return journal

    def first(self, *steps: Step) -> list[Entry]:
        """A new runtime's first steps (its options), applied but not appended: the store
        writes them with the runtime (Store.create_runtime), in one transaction, so that no
        runtime is ever stored without them. Nobody listens to its events yet."""
        entries, _ = self._applied(steps, self.clock.time())
        return entries

    def stored(self) -> None:
        """Its entries so far were stored with the runtime (a fork's, a replay's: Store.create_runtime,
        with the running flag and the figures the tree has now)."""
        self._was_running = self.tree.active
        self._counts = self.tree.counts

    def _applied(self, steps: Sequence[Step], now: float) -> tuple[list[Entry], list[_Made]]:
        entries: list[Entry] = []
        made: list[_Made] = []
        event_seq = self.events.last_seq
        for step in steps:
            apply(self.tree, step, now)
            first = event_seq + 1
            for handle_id, kind, fields in step.events():
                event_seq += 1
                made.append((event_seq, handle_id, kind, fields))
            self.last_seq += 1
            entries.append(Entry(self.last_seq, now, first, event_seq - first + 1, step))
        self.events.last_seq = event_seq
        return entries, made

    async def record(self, *steps: Step) -> None:
        if self.closed:  # a copy that left this process's memory (its lease moved, a write failed): it writes nothing
            if self.deleted:  # (the tree is named by the key, `tenant:id`)
                raise NotFound("runtime", self.tree.runtime_id.rpartition(":")[2], "it was deleted")
            raise Fenced(self.tree.runtime_id)
        now = self.clock.time()
        entries, made = self._applied(steps, now)
        running = self.tree.active
        changed = running if running != self._was_running else None
        self._was_running = running
        counts = self.tree.counts
        new_counts = counts if counts != self._counts else None
        self._counts = counts
        try:
            await self.store.append(self.tree.runtime_id, entries, changed, new_counts)
        except BaseException as exc:
            # The tree holds steps the store never took: this copy writes and answers no more,
            # and the runtime is read again from the store at its next call (service.runtime).
            self.closed = True
            if isinstance(exc, Exception) and not isinstance(exc, DomainError):
                log.error(
                    "runtime %s: the store did not take a journal write; its copy stops", self.tree.runtime_id, exc_info=exc
                )
                raise NotJournaled(self.tree.runtime_id) from exc
            raise
        # Events are built only when someone takes them live (read after the append: a watcher
        # that subscribed meanwhile read its history before these entries existed).
        if made and self.events.listened:
            self.events.publish(
                [Event(seq=seq, time=now, handle_id=h, kind=k, **fields) for seq, h, k, fields in made]  # type: ignore[arg-type]
            )
