"""The steps: every change to a runtime is one of them, a frozen value. Steps are facts, never
commands: applying one (`apply`) cannot fail and does no I/O, and it names the events a
watcher sees of it (`events`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..billing.usage import NO_COST, NO_TOKENS, Cost, Tokens, Usage
from ..vocabulary import Answer, Budget, HandleState, InboxItem, Message, RuntimeOptions, TaskResult, ToolCall, ToolResult
from .events import EventKind
from .forks import Forked, Held, Replaying, Rewound
from .handle import Handle
from .imported import EventsImported, Imported
from .replied import Replied
from .tree import Tree

OUTPUT_PREVIEW = 1000  # characters of a tool result a ToolCallEnded event carries


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
        # A model call is under way: nothing else changes until its reply is recorded.
        handle = tree.handles.get(self.handle_id)
        if handle is not None:
            handle.turn_begun = self.turn

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return [(self.handle_id, EventKind.TURN_STARTED, {"turn": self.turn})]


@dataclass(frozen=True)
class ModelReplied:
    """A model reply, recorded before it is acted on: replay never buys it again."""

    handle_id: str
    message: Message
    tokens: int  # split.total
    usage: Usage  # the handle's usage after it (what the TurnEnded event reports)
    estimated: bool = False  # the provider reported no usage: `tokens` is the runtime's estimate
    # The reply's tokens as the provider bills them, and their cost at the prices in force
    # when it came: recorded, so a replay (and a later price change) never changes history.
    split: Tokens = NO_TOKENS
    cost: Cost = NO_COST

    def apply(self, tree: Tree) -> None:
        tree.handles[self.handle_id].add_reply(self.message, self.split, self.cost, self.estimated)
        tree.spent(self.split, self.cost)

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        fields: dict[str, object] = {
            "turn": self.message.turn,
            "tokens": self.tokens,
            "own_tokens": self.usage.own_tokens,
            "total_tokens": self.usage.total_tokens,
            "tool_calls": len(self.message.tool_calls),
            "usage_estimated": self.estimated,
            "split": self.split,
            "cost": self.cost,
            "usage": self.usage,
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
    | Replied
    | Forked
    | Held
    | Rewound
    | Replaying
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
    Replied,
    Forked,
    Held,
    Rewound,
    Replaying,
)
