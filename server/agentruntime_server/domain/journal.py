"""The journal: every change to a runtime is one step, a value that is applied to the
in-memory tree and appended to the store together (`Journal.record`). Restoring a runtime
from the store is `replay`: the same steps applied again, in order, to an empty tree.

Steps are facts, never commands: applying one cannot fail and does no I/O. The store
keeps them versioned (store/payloads.py), so a store written by an older release replays
in a newer one. Each step also names the events a watcher sees (`events_of`): events are
derived from steps, never written on their own."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import DomainError, Fenced, NotFound, NotJournaled
from .events import Event, EventKind, EventLog
from .handle import Handle
from .model import (
    AgentSpec,
    Answer,
    Budget,
    HandleState,
    InboxItem,
    Message,
    PendingRequest,
    RuntimeOptions,
    TaskResult,
    ToolCall,
    ToolResult,
)
from .usage import Usage

if TYPE_CHECKING:
    from .ports import Store

log = logging.getLogger(__name__)

OUTPUT_PREVIEW = 1000  # characters of a tool result a ToolCallEnded event carries


class Tree:
    """The state the journal builds: every handle, and the indexes over them."""

    def __init__(self, runtime_id: str, agents: tuple[AgentSpec, ...]) -> None:
        self.runtime_id = runtime_id
        self.agents = {agent.name: agent for agent in agents}
        self.handles: dict[str, Handle] = {}
        self.top_level_per_agent: dict[str, int] = {}
        # Live Requests by id -> the handle that made them.
        self.requests: dict[str, Handle] = {}
        # Answered Requests by id -> (the answer, the id of the handle it answered).
        self.answered: dict[str, tuple[Answer, str]] = {}
        # Answered Requests by id -> the topmost handle its Resume continued so far (a retried
        # Resume answers with that handle's result). Derived, with Handle.mark, from the steps:
        # `clock` orders the Answered and Settled steps applied.
        self.resumed_top: dict[str, str] = {}
        self.clock = 0
        self.running = 0  # handles with a run in flight (RUNNING or QUEUED)
        self.beating = 0  # open handles with a heartbeat
        self.suspended = 0
        self.options = RuntimeOptions()

    def changed_state(self, before: HandleState, after: HandleState, beats: bool = False) -> None:
        """Keeps the counts the store indexes: handles in flight (runtimes to recover),
        suspended ones, and open handles with a heartbeat (`beats`: this one has one)."""
        self.running += after.in_flight - before.in_flight
        self.suspended += (after is HandleState.SUSPENDED) - (before is HandleState.SUSPENDED)
        if beats:
            self.beating -= (after is HandleState.CLOSED) - (before is HandleState.CLOSED)

    @property
    def counts(self) -> tuple[int, int, int]:
        """(handles, running, suspended): what ListRuntimes shows of a runtime."""
        return len(self.handles), self.running, self.suspended

    @property
    def active(self) -> bool:
        """The runtime needs a process: a run is in flight, a heartbeat is due or a live
        Request lapses (the store's `running` flag, by which a starting server finds the
        runtimes to load)."""
        return self.running > 0 or self.beating > 0 or self.expiring

    @property
    def expiring(self) -> bool:
        """A live Request has an expiry: when it passes unanswered, the call's result is an
        error and the run goes on, which takes a process."""
        return any(handle.pending is not None and handle.pending.expires_at is not None for handle in self.requests.values())


# ---- steps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Configured:
    """The runtime's own options, journaled first when it is created."""

    options: RuntimeOptions

    def apply(self, tree: Tree) -> None:
        tree.options = self.options

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class Spawned:
    handle_id: str
    parent_id: str  # "" for a top-level handle
    agent: str
    budget: Budget
    child_key: str  # the parent's call id (or judge key) that spawned it; "" for a host's Spawn
    number: int  # the per-parent, per-agent counter in the id: `worker.3`

    def apply(self, tree: Tree) -> None:
        parent = tree.handles[self.parent_id] if self.parent_id else None
        handle = Handle(self.handle_id, parent, tree.agents[self.agent], self.budget, self.child_key, len(tree.handles) + 1)
        tree.handles[handle.id] = handle
        tree.beating += handle.agent.heartbeat is not None
        if parent is None:
            tree.top_level_per_agent[self.agent] = max(tree.top_level_per_agent.get(self.agent, 0), self.number)
        else:
            parent.adopt(handle, self.number)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return [(self.handle_id, EventKind.SPAWNED, {"parent_id": self.parent_id or "root", "agent": self.agent})]


@dataclass(frozen=True)
class Posted:
    handle_id: str
    item: InboxItem

    def apply(self, tree: Tree) -> None:
        tree.handles[self.handle_id].post(self.item)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class Ticked:
    """A heartbeat came due: a coalesced tick in the inbox, counting the periods it stands
    for (after downtime: one tick for every period missed)."""

    handle_id: str
    at: float
    count: int = 1

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        beat = handle.agent.heartbeat
        prompt = beat.prompt if beat is not None else "heartbeat"
        handle.post(InboxItem(prompt, "", "heartbeat", coalesce_key=HEARTBEAT_KEY, count=self.count))
        handle.last_tick = self.at

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


HEARTBEAT_KEY = "heartbeat"


def _continue_chain(tree: Tree, handle: Handle) -> None:
    """A SUSPENDED handle runs on (a Resume, or a child settled): the Resume whose chain of
    continued runs reaches it is the latest marked since it suspended, its own Answer's or a
    child's that settled since. The chain then climbs to this handle."""
    since = handle.settled_at
    found: tuple[str, int] | None = None
    source: Handle | None = None
    for node in (handle, *handle.children):
        if node.mark is not None and node.mark[1] > since and (found is None or node.mark[1] > found[1]):
            found, source = node.mark, node
    if found is None or source is None:
        handle.mark = None
        return
    if source is not handle:
        source.mark = None
    handle.mark = found
    tree.resumed_top[found[0]] = handle.id


@dataclass(frozen=True)
class Queued:
    """A woken handle waits for a slot (`queued`), or has got it and runs."""

    handle_id: str
    queued: bool

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        before = handle.state
        handle.state = HandleState.QUEUED if self.queued else HandleState.RUNNING
        tree.changed_state(before, handle.state)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        state = HandleState.QUEUED if self.queued else HandleState.RUNNING
        return [(self.handle_id, EventKind.STATE_CHANGED, {"state": state})]


@dataclass(frozen=True)
class RunStarted:
    """A Wake or a task call (with the message it starts on and the inbox items it drained),
    or a continued run (after a Resume or a restart: no message, nothing drained)."""

    handle_id: str
    message: Message | None
    drained: int = 0

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        before = handle.state
        if self.message is not None:
            handle.mark = None  # a new run continues no Resume
        elif before is HandleState.SUSPENDED:
            _continue_chain(tree, handle)
        handle.begin_run(self.message, self.drained)
        tree.changed_state(before, handle.state)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return [(self.handle_id, EventKind.STATE_CHANGED, {"state": HandleState.RUNNING})]


@dataclass(frozen=True)
class TurnStarted:
    handle_id: str
    turn: int

    def apply(self, tree: Tree) -> None:
        pass  # a model call is under way: nothing changes until its reply is recorded

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return [(self.handle_id, EventKind.TURN_STARTED, {"turn": self.turn})]


@dataclass(frozen=True)
class ModelReplied:
    """A model reply, recorded before it is acted on: replay never buys it again."""

    handle_id: str
    message: Message
    tokens: int
    usage: Usage  # the handle's usage after it (what the TurnEnded event reports)
    estimated: bool = False  # the provider reported no usage: `tokens` is the runtime's estimate

    def apply(self, tree: Tree) -> None:
        tree.handles[self.handle_id].add_reply(self.message, self.tokens)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        fields: dict[str, object] = {
            "turn": self.message.turn,
            "tokens": self.tokens,
            "own_tokens": self.usage.own_tokens,
            "total_tokens": self.usage.total_tokens,
            "tool_calls": len(self.message.tool_calls),
            "usage_estimated": self.estimated,
        }
        return [(self.handle_id, EventKind.TURN_ENDED, fields)]


@dataclass(frozen=True)
class CallStarted:
    """A tool call begins (or, not announced, a relay or `ask` call goes out to the host):
    tool-call budgets count it from now. `effect`: it acts outside the process (an http
    tool), so after a crash without its result it is in doubt. `announce`: watchers are told
    (a reattached task call started long ago is not announced again)."""

    handle_id: str
    call: ToolCall
    effect: bool = False
    announce: bool = True

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        handle.start_call(self.call.id)
        if self.effect:
            handle.started = handle.started | {self.call.id}

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return [(self.handle_id, EventKind.TOOL_CALL_STARTED, {"call": self.call})] if self.announce else []


@dataclass(frozen=True)
class CallSuspended:
    """A running tool answered with a Request (HTTP 202): the call is not in doubt, it waits
    for the host's answer and will be made again with it."""

    handle_id: str
    call_id: str

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        handle.started = handle.started - {self.call_id}
        handle.tool_rounds[self.call_id] = handle.tool_rounds.get(self.call_id, 0) + 1

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class CallFinished:
    """A tool call's result, recorded before it is acted on: replay never runs it again."""

    handle_id: str
    call: ToolCall
    result: ToolResult

    def apply(self, tree: Tree) -> None:
        tree.handles[self.handle_id].add_result(self.call.id, self.result)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        fields: dict[str, object] = {
            "call_id": self.call.id,
            "call": self.call,
            "is_error": self.result.is_error,
            "output": self.result.output[:OUTPUT_PREVIEW],
        }
        return [(self.handle_id, EventKind.TOOL_CALL_ENDED, fields)]


@dataclass(frozen=True)
class MessagesAppended:
    """Messages the runtime adds to a transcript: a tool phase's results (in one step, so
    they never land half), a completion gate's feedback, answers to dangling calls."""

    handle_id: str
    messages: tuple[Message, ...]

    def apply(self, tree: Tree) -> None:
        tree.handles[self.handle_id].transcript.extend(self.messages)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class Compacted:
    """The model's view of a handle now starts with this summary, then the transcript from
    `upto`: the turns before it were summarized (they stay in the transcript)."""

    handle_id: str
    upto: int
    summary: Message

    def apply(self, tree: Tree) -> None:
        tree.handles[self.handle_id].compactions.append((self.upto, self.summary))

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class Settled:
    """A run is over (or suspended): its result and the handle's state after it.
    `rollback_to` >= 0: an interrupted run's transcript is cut back there and the inbox
    items it drained (`restored`) come back."""

    handle_id: str
    result: TaskResult
    state: HandleState
    rollback_to: int = -1
    restored: tuple[InboxItem, ...] = ()

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        if handle.pending is not None:
            tree.requests.pop(handle.pending.id, None)  # a withdrawn Request is no longer live
        tree.clock += 1
        handle.settled_at = tree.clock
        if handle.mark is not None:
            handle.mark = (handle.mark[0], tree.clock)
        before = handle.state
        handle.settle(self.result, self.state, self.rollback_to, self.restored)
        tree.changed_state(before, handle.state, handle.agent.heartbeat is not None)
        pending = handle.pending
        if pending is not None and pending.path == handle.path:
            tree.requests[pending.id] = handle

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        events: list[tuple[str, EventKind, dict[str, object]]] = []
        if self.result.pending is not None:
            events.append((self.handle_id, EventKind.PENDING, {"pending": self.result.pending}))
        events.append((self.handle_id, EventKind.RESULT, {"result": self.result}))
        events.append((self.handle_id, EventKind.STATE_CHANGED, {"state": self.state}))
        return events


@dataclass(frozen=True)
class Answered:
    """The host answered a live Request: approved calls may run once, in-doubt calls to run
    again leave the in-doubt set (the results the answer gives follow as CallFinished)."""

    request_id: str
    answer: Answer
    handle_id: str  # the handle whose own Request it was
    approved: tuple[str, ...] = ()
    rerun: tuple[str, ...] = ()
    for_tool: tuple[str, ...] = ()  # calls whose tool asked: it is called again with this answer

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        tree.requests.pop(self.request_id, None)
        tree.answered[self.request_id] = (self.answer, self.handle_id)
        tree.clock += 1
        handle.mark = (self.request_id, tree.clock)
        tree.resumed_top[self.request_id] = handle.id
        handle.approved = handle.approved.union(self.approved)
        handle.in_doubt = handle.in_doubt.difference(self.rerun)
        for call_id in self.for_tool:
            handle.tool_answers[call_id] = self.answer

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class BudgetSet:
    """The host extended a handle's budget (Resume of a `budget` Request)."""

    handle_id: str
    budget: Budget

    def apply(self, tree: Tree) -> None:
        tree.handles[self.handle_id].set_budget(self.budget)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class InDoubt:
    """Recovery found calls that were in flight when the process died, whose tool says ASK."""

    handle_id: str
    call_ids: tuple[str, ...]

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        handle.in_doubt = handle.in_doubt.union(self.call_ids)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class Closed:
    handle_id: str

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        before = handle.state
        handle.close()
        tree.changed_state(before, handle.state, handle.agent.heartbeat is not None)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return [(self.handle_id, EventKind.STATE_CHANGED, {"state": HandleState.CLOSED})]


@dataclass(frozen=True)
class Imported:
    """A handle as a store of release 0.1.0 kept it (before the journal): its whole state at
    once. Only a store migration writes it."""

    handle_id: str
    usage: Usage
    state: HandleState
    inbox: tuple[InboxItem, ...]
    transcript: tuple[Message, ...]
    tool_results: dict[str, ToolResult]
    started: tuple[str, ...]
    last_result: TaskResult | None
    pending: PendingRequest | None
    approved: tuple[str, ...]
    in_doubt: tuple[str, ...]

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        handle.usage = self.usage
        tree.changed_state(handle.state, self.state, handle.agent.heartbeat is not None)
        handle.state = self.state
        handle.inbox.extend(self.inbox)
        handle.transcript.extend(self.transcript)
        # Its current run began at its last user message, as far as its transcript tells.
        users = [index for index, message in enumerate(handle.transcript) if message.role == "user"]
        handle.run_start = users[-1] if users else 0
        handle.tool_results.update(self.tool_results)
        handle.started = handle.started.union(self.started)
        if self.state.in_flight or self.state is HandleState.SUSPENDED:
            for call_id in self.started:
                handle.start_call(call_id)  # in flight when it was migrated: counted as under way
        handle.last_result = self.last_result
        handle.pending = self.pending
        handle.approved = handle.approved.union(self.approved)
        handle.in_doubt = handle.in_doubt.union(self.in_doubt)
        if self.state is HandleState.SUSPENDED and self.pending is not None and self.pending.path == handle.path:
            tree.requests[self.pending.id] = handle

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []


@dataclass(frozen=True)
class EventsImported:
    """Events a store of release 0.1.0 kept (before events were derived from steps)."""

    kept: tuple[Event, ...]

    def apply(self, tree: Tree) -> None:
        pass

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []  # its events are kept whole, with their own numbers and times


Step = (
    Configured
    | Spawned
    | Posted
    | Ticked
    | Queued
    | RunStarted
    | TurnStarted
    | ModelReplied
    | CallStarted
    | CallSuspended
    | CallFinished
    | MessagesAppended
    | Compacted
    | Settled
    | Answered
    | BudgetSet
    | InDoubt
    | Closed
    | Imported
    | EventsImported
)
STEPS: tuple[type[Step], ...] = (
    Configured,
    Spawned,
    Posted,
    Ticked,
    Queued,
    RunStarted,
    TurnStarted,
    ModelReplied,
    CallStarted,
    CallSuspended,
    CallFinished,
    MessagesAppended,
    Compacted,
    Settled,
    Answered,
    BudgetSet,
    InDoubt,
    Closed,
    Imported,
    EventsImported,
)


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


def replay(tree: Tree, entries: Sequence[Entry]) -> None:
    """Rebuilds a tree from its journal: the steps applied again, in order."""
    for entry in entries:
        _apply(tree, entry.step, entry.at)


def _apply(tree: Tree, step: Step, at: float) -> None:
    step.apply(tree)
    if isinstance(step, Spawned) and tree.handles[step.handle_id].agent.heartbeat is not None:
        # A heartbeat's periods run from the spawn: those missed before a first tick (the
        # server down meanwhile) come due at the restart, counted, as later ones do.
        tree.handles[step.handle_id].last_tick = at


_Made = tuple[int, str, EventKind, dict[str, object]]  # an event of a step recorded: (seq, handle, kind, fields)


@dataclass
class Journal:
    """Records steps: applied to the tree, appended to the store, then told to watchers."""

    tree: Tree
    store: Store
    events: EventLog
    last_seq: int = 0
    closed: bool = field(default=False, init=False)
    deleted: bool = field(default=False, init=False)  # closed as its runtime is deleted: a write gets NotFound
    _was_running: bool = field(default=False, init=False)
    _counts: tuple[int, int, int] = field(default=(0, 0, 0), init=False)

    @classmethod
    def restore(cls, tree: Tree, store: Store, events: EventLog, entries: Sequence[Entry]) -> Journal:
        replay(tree, entries)
        journal = cls(tree, store, events, entries[-1].seq if entries else 0)
        events.last_seq = max((entry.last_event for entry in entries), default=0)
        journal._was_running = tree.active
        journal._counts = tree.counts
        return journal

    def first(self, *steps: Step) -> list[Entry]:
        """A new runtime's first steps (its options), applied but not appended: the store
        writes them with the runtime (Store.create_runtime), in one transaction, so that no
        runtime is ever stored without them. Nobody listens to its events yet."""
        entries, _ = self._applied(steps, time.time())
        return entries

    def _applied(self, steps: Sequence[Step], now: float) -> tuple[list[Entry], list[_Made]]:
        entries: list[Entry] = []
        made: list[_Made] = []
        event_seq = self.events.last_seq
        for step in steps:
            _apply(self.tree, step, now)
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
        now = time.time()
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
