"""A runtime's event log: every change, numbered per runtime, persisted before anyone sees it.
Events are derived from journal steps (journal/entry.py); the store keeps the steps.

Watchers read the history from the store a page at a time, then follow live events through
a queue. What a watcher holds (the page of history it has yet to send, and its queue) is
bounded: one that falls `buffer` events behind is dropped and told so, and resumes from the
store with the last seq it saw. A slow consumer never slows the runtime, and one that reads
nothing holds a page, never its runtime's history. A watcher that asks for deltas
(deltas.py) also gets the pieces of model replies as they stream, the turns in progress
first from index 0."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import DomainError, NotFound, ResourceExhausted, Unavailable
from ..journal.events import Event, EventKind, Observer
from .deltas import Delta, TurnStream

__all__ = ["Event", "EventKind", "EventLog", "Observer", "tell_gone"]  # Event and EventKind: journal/events.py


Live = Event | Delta | None  # what a watcher's queue holds; None: its stream ends
# Journal entries a watcher reads from the store at once (each makes at most 3 events, but
# for a migrated store's imported events): a page is read, converted and sent before the
# next is read, and the loop serves others between two pages. A page of 64 holds the loop
# for about 0.7 ms on SQLite (bench/watch_memory.py; 200: 2 ms), so 40 watchers that start
# together hold it for 30 ms a round.
HISTORY_PAGE = 64
# Events a watcher that asked for batches gets in one (follow_batches): what is at hand, up to this.
BATCH = 64


class Backlog(asyncio.Queue[Live]):
    """A watcher's live items not yet sent; and `held`, the events of the history page it
    read and has not sent yet. Together they are how far it is behind."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0


_NO_WATCHERS: set[Backlog] = set()  # never added to: see follow()


def tell_gone(observers: Sequence[Observer], runtime_id: str, now: float, last_seq: int = 0) -> None:
    """Observers drop what they hold of a runtime that left this process (RUNTIME_GONE)."""
    if observers:
        gone = Event(seq=last_seq, time=now, handle_id="", kind=EventKind.RUNTIME_GONE)
        for observe in observers:
            observe(runtime_id, gone)


class EventLog:
    def __init__(
        self,
        runtime_id: str,
        history: Callable[[int, int], Awaitable[list[Event]]],
        buffer: int = 1000,
        observers: tuple[Observer, ...] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.runtime_id = runtime_id
        self.history = history  # the persisted events after a seq, of at most so many journal entries
        self.last_seq = 0
        self.published_seq = 0  # the last event published: its step is appended to the store
        self.buffer = buffer  # events a watcher may fall behind (its history page and its queue)
        # A page of history a watcher holds, with room to spare in its buffer for what happens meanwhile.
        self.page = max(1, min(HISTORY_PAGE, buffer // 4))
        self.clock = clock
        self.observers = observers
        self._watchers: set[Backlog] = _NO_WATCHERS  # made at the first watcher
        self._delta_watchers: set[Backlog] = _NO_WATCHERS  # those of them that asked for deltas
        self._streams: dict[str, TurnStream] = {}  # by handle: its turn in progress, while streamed
        self.closing = False
        self.deleted = False

    @property
    def watched(self) -> bool:
        return bool(self._watchers)

    @property
    def wants_deltas(self) -> bool:
        """Someone watches with deltas: a model turn starting now streams its reply."""
        return bool(self._delta_watchers)

    @property
    def listened(self) -> bool:
        """Someone takes live events (an observer or a watcher); history is derived from the store."""
        return bool(self.observers or self._watchers)

    def publish(self, events: list[Event]) -> None:
        """Events of steps the journal has just appended to the store."""
        if events:
            self.published_seq = events[-1].seq
        for event in events:
            for observe in self.observers:
                observe(self.runtime_id, event)
        for queue in list(self._watchers):
            for event in events:
                if not self._offer(queue, event):
                    break

    def _offer(self, queue: Backlog, item: Event | Delta) -> bool:
        if queue.qsize() + queue.held < self.buffer:
            queue.put_nowait(item)
            return True
        # Too far behind: drop what it has not read (so it cannot skip any) and tell it to
        # reconnect; it reads the rest from the store.
        self._watchers.discard(queue)
        self._delta_watchers.discard(queue)
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)
        return False

    # ---- deltas (deltas.py) ------------------------------------------------------------------

    def open_stream(self, handle_id: str, turn: int) -> TurnStream:
        """The stream of a model turn of `handle_id` that starts now."""
        stream = self._streams[handle_id] = TurnStream(self, handle_id, turn)
        return stream

    def end_stream(self, stream: TurnStream) -> None:
        if self._streams.get(stream.handle_id) is stream:
            del self._streams[stream.handle_id]

    def publish_delta(self, delta: Delta) -> None:
        for queue in list(self._delta_watchers):
            self._offer(queue, delta)

    def close(self, deleted: bool = False) -> None:
        """Every watcher's stream ends: at a shutdown (or when the runtime leaves this replica)
        it is told to reconnect; when the runtime is deleted, that it is gone."""
        self.closing = True
        self.deleted = deleted
        tell_gone(self.observers, self.runtime_id, self.clock.time(), self.last_seq)
        self._streams.clear()
        self._delta_watchers = _NO_WATCHERS
        for queue in list(self._watchers):
            self._watchers.discard(queue)
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)

    async def follow(self, after_seq: int, deltas: bool = False) -> AsyncGenerator[Event | Delta, None]:
        """History after `after_seq` from the store, then live events, in order, once each.
        With `deltas`, also the pieces of model replies: those of every turn in progress from
        index 0 (in their place among the history's events), then live ones."""
        async with contextlib.aclosing(self.follow_batches(after_seq, deltas, 1)) as items:
            async for item in items:
                if isinstance(item, Delta):
                    yield item
                else:
                    for event in item:
                        yield event

    async def follow_batches(
        self, after_seq: int, deltas: bool = False, most: int = BATCH
    ) -> AsyncGenerator[list[Event] | Delta, None]:
        """`follow`, with the events that are at hand together in one list (a page of history,
        or what came live while the watcher sent the last batch), at most `most` of them; a
        delta comes alone, in its place between them."""
        queue = Backlog()
        if self._watchers is _NO_WATCHERS:
            self._watchers = set()
        self._watchers.add(queue)  # subscribe first, so nothing falls between history and live
        # The history goes up to here: later events come through the queue, in order with the
        # deltas made between them.
        horizon = self.last_seq
        kept: list[Delta] = []
        if deltas:
            if self._delta_watchers is _NO_WATCHERS:
                self._delta_watchers = set()
            self._delta_watchers.add(queue)
            kept = sorted((piece for stream in self._streams.values() for piece in stream.pieces), key=_after)
        # The last piece sent of each turn's stream: the queue may hold it again.
        sent = {(piece.handle_id, piece.turn): (piece.attempt, piece.index) for piece in kept}
        batch: list[Event] = []
        try:
            seen = after_seq
            at = 0
            while seen < horizon:
                page = await self.history(seen, self.page)
                if not page:  # (events not in the store yet: they come through the queue)
                    break
                queue.held = len(page)
                for event in page:
                    # A shutdown or a delete ends a stream still sending its history at once; and
                    # one dropped for falling behind reads no more of it.
                    if self.closing or queue not in self._watchers:
                        raise self._ended(seen)
                    if event.seq > horizon:  # later events come through the queue
                        break
                    while at < len(kept) and kept[at].after_seq < event.seq:
                        if batch:
                            yield batch
                            batch = []
                        yield kept[at]
                        at += 1
                    queue.held -= 1
                    batch.append(event)
                    seen = event.seq
                    if len(batch) >= most:
                        yield batch
                        batch = []
                else:
                    if batch:
                        yield batch
                        batch = []
                    await asyncio.sleep(0)  # the page is sent: others' turn before the next is read
                    continue
                break
            if batch:
                yield batch
                batch = []
            queue.held = 0
            for piece in kept[at:]:
                yield piece
            while True:
                live = None if self.closing else await queue.get()  # (a log closed before it came has no more)
                while True:
                    if live is None:
                        if batch:
                            yield batch  # (what came before the end, then the end)
                            batch = []
                        raise self._ended(seen)
                    if isinstance(live, Delta):
                        if batch:
                            yield batch
                            batch = []
                        last = sent.get((live.handle_id, live.turn))
                        if last is None or last[0] != live.attempt or live.index > last[1]:
                            yield live
                    elif live.seq > seen:
                        batch.append(live)
                        seen = live.seq
                        if len(batch) >= most:
                            yield batch
                            batch = []
                    if queue.empty():
                        break
                    live = queue.get_nowait()  # at hand: it joins the batch
                if batch:
                    yield batch
                    batch = []
        finally:
            self._watchers.discard(queue)
            self._delta_watchers.discard(queue)

    def _ended(self, seen: int) -> DomainError:
        """Why a watcher's stream ends, after `seen`: its runtime deleted, the log closed (a
        shutdown, the runtime left this replica), or the watcher fell too far behind."""
        if self.deleted:  # (the log is named by the key, `tenant:id`)
            return NotFound("runtime", self.runtime_id.rpartition(":")[2], f"it was deleted after seq {seen}")
        if self.closing:
            return Unavailable(f"the server is shutting down; Watch again with after_seq={seen}")
        return ResourceExhausted(
            f"this watcher fell more than {self.buffer} events behind at seq {seen}; Watch again with after_seq={seen}",
            reason="WATCH_LAGGING",
        )


def _after(delta: Delta) -> int:
    return delta.after_seq
