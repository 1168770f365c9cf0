"""One agent in a tree: its state, usage and transcript, as the journal replays them (its
run in flight, if any, is no part of it: runs.py).

The state changes only through the transition methods below, and only the journal
(journal/steps.py) calls them: every change is a journal step, applied here and appended to
the store together."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterator
from typing import Any

from ..billing.usage import Cost, Tokens, Usage
from ..fifo_gate import FifoGate
from ..vocabulary import (
    AgentSpec,
    Answer,
    Budget,
    Failure,
    HandleSnapshot,
    HandleState,
    InboxItem,
    Limit,
    Message,
    PendingRequest,
    Status,
    TaskResult,
    ToolResult,
)

NONE: frozenset[str] = frozenset()


class Handle:
    # Slots: a runtime with thousands of suspended handles keeps every one in memory.
    __slots__ = (
        "__weakref__",
        "_parent",
        "agent",
        "approved",
        "budget",
        "calls_out",
        "child_key",
        "children",
        "children_by_key",
        "compactions",
        "gate",
        "held_micros",
        "held_tokens",
        "id",
        "in_doubt",
        "inbox",
        "inherited",
        "last_result",
        "last_tick",
        "mark",
        "pending",
        "run_start",
        "runs",
        "seq",
        "settled_at",
        "spawned_per_agent",
        "started",
        "state",
        "subtree_calls_out",
        "tool_answers",
        "tool_results",
        "tool_rounds",
        "transcript",
        "turn_begun",
        "usage",
    )

    def __init__(
        self,
        handle_id: str,
        parent: Handle | None,
        agent: AgentSpec,
        budget: Budget,
        child_key: str = "",
        seq: int = 0,
    ) -> None:
        self.id = handle_id
        # The parent is held weakly (the tree holds every handle, and a parent its children):
        # a tree of handles is no reference cycle, so a runtime that leaves memory is freed as
        # it leaves, not at the collector's next full pass, which a serving process's
        # thresholds put off for tens of thousands of roots (docs/performance.md#memory-flat).
        self._parent = None if parent is None else weakref.ref(parent)
        self.agent = agent
        self.budget = budget
        self.child_key = child_key  # the parent's call id (or judge key) that spawned it
        self.seq = seq  # spawn order within the runtime
        self.turn_begun = 0  # the last model turn a TurnStarted began (journal-derived): its re-run resets its stream
        self.state = HandleState.IDLE
        self.usage = Usage()
        self.children: list[Handle] = []
        self.spawned_per_agent: dict[str, int] = {}
        self.children_by_key: dict[str, Handle] = {}
        self.inbox: list[InboxItem] = []  # a list, not a deque: a deque costs ten times its memory empty
        self.transcript: list[Message] = []
        self.tool_results: dict[str, ToolResult] = {}
        # Calls with an effect outside the process that started and have no result yet:
        # after a crash they are in doubt.
        # Frozen and replaced on change (rarely): an empty set costs 216 bytes, and a runtime
        # with thousands of handles keeps three of them per handle.
        self.started: frozenset[str] = NONE
        # Derived from the journal (replay rebuilds them): the calls the tool phase let through
        # that have no result yet (any kind: a task call while its child runs too), and how many
        # the whole subtree has. Budgets count them as spent from the moment they start, so
        # calls running at once (a child's and its sibling's) never pass a budget together.
        # A set of its own once a call is out (changed in place: a turn's 1,000 task calls
        # would copy a frozenset 1,000 times), the shared empty one again once none is.
        self.calls_out: frozenset[str] | set[str] = NONE
        self.subtree_calls_out = 0
        # In memory only, never journaled (reservations.py): what the model turns under way in
        # its subtree are reserved, held against its max_tokens and max_cost until they reply.
        self.held_tokens = 0
        self.held_micros = 0
        self.last_result: TaskResult | None = None
        self.inherited: Usage | None = None  # in a fork: its figures at the cut (Forked)
        # The Request this handle presents while SUSPENDED: its own, or a suspended child's.
        self.pending: PendingRequest | None = None
        self.approved: frozenset[str] = NONE
        # A suspending tool's calls: how often each asked, and the host's latest answer.
        self.tool_rounds: dict[str, int] = {}
        self.tool_answers: dict[str, Answer] = {}
        # Calls that were in flight when the process died and whose tool says ASK.
        self.in_doubt: frozenset[str] = NONE
        self.last_tick: float | None = None  # when its heartbeat last ticked (before a first tick: its spawn)
        # Compactions: (the transcript index the model's view resumes at, the summary before it).
        self.compactions: list[tuple[int, Message]] = []
        # Derived from the journal (replay rebuilds them): the runs started on a message (a
        # Wake, a task call), and where in the transcript the latest one started.
        self.runs = 0
        self.run_start = 0
        # Which Resume this handle's run continues (the answered request id), and when: see
        # Tree.clock and Tree.resumed_top.
        self.mark: tuple[str, int] | None = None
        self.settled_at = 0  # Tree.clock at its latest Settled
        self.gate = FifoGate(budget.max_concurrent) if budget.max_concurrent else None

    @property
    def parent(self) -> Handle | None:
        return None if self._parent is None else self._parent()

    @property
    def parent_id(self) -> str:
        return self.parent.id if self.parent else "root"

    @property
    def subtree_tool_calls_spent(self) -> int:
        """What the subtree's tool-call budget has spent: the calls finished, and those under way."""
        return self.usage.subtree_tool_calls + self.subtree_calls_out

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.id.split("/"))

    def lineage(self) -> Iterator[Handle]:
        """The handle, then each ancestor up to the top."""
        node: Handle | None = self
        while node is not None:
            yield node
            node = node.parent

    def subtree_leaf_first(self) -> list[Handle]:
        order: list[Handle] = []
        for child in self.children:
            order.extend(child.subtree_leaf_first())
        order.append(self)
        return order

    def gate_rejections(self) -> int:
        """The completion gate's rejections in the current run: the feedback messages since its
        first message (the only user messages a run adds), so a Resume or a restart counts on."""
        return sum(message.role == "user" for message in self.transcript[self.run_start + 1 :])

    def model_view(self) -> tuple[Message, ...]:
        """What the model is sent: the transcript, or since a compaction its summary and the
        turns after it."""
        if not self.compactions:
            return tuple(self.transcript)
        upto, summary = self.compactions[-1]
        return (summary, *self.transcript[upto:])

    def transcript_with_summaries(self) -> list[Message]:
        """Every message, with each compaction's summary where it took effect (GetTranscript)."""
        if not self.compactions:
            return self.transcript
        merged: list[Message] = []
        summaries = sorted(self.compactions, key=lambda compaction: compaction[0])
        position = 0
        for upto, summary in summaries:
            merged.extend(self.transcript[position:upto])
            merged.append(summary)
            position = upto
        merged.extend(self.transcript[position:])
        return merged

    # ---- transitions (called by the journal only) -----------------------------------------

    def adopt(self, child: Handle, number: int) -> None:
        self.children.append(child)
        self.spawned_per_agent[child.agent.name] = max(self.spawned_per_agent.get(child.agent.name, 0), number)
        if child.child_key:
            self.children_by_key[child.child_key] = child

    def post(self, item: InboxItem) -> None:
        """Into the inbox; an item with the coalesce key of one still waiting replaces it,
        keeping its place and counting both."""
        if item.coalesce_key:
            for index, waiting in enumerate(self.inbox):
                if waiting.coalesce_key == item.coalesce_key:
                    self.inbox[index] = dataclasses.replace(item, count=waiting.count + item.count)
                    return
        self.inbox.append(item)

    def begin_run(self, message: Message | None, drained: int) -> None:
        """A new run takes `drained` inbox items and starts on `message`; a continued run
        (after a Resume or a restart) has no message of its own."""
        del self.inbox[:drained]
        if message is not None:
            self.runs += 1
            self.run_start = len(self.transcript)
            self.transcript.append(message)
        self.state = HandleState.RUNNING
        self.pending = None

    def add_reply(self, message: Message, tokens: Tokens, cost: Cost, estimated: bool) -> None:
        self.transcript.append(message)
        self.usage = self.usage.after_reply(tokens, cost, estimated)
        node = self.parent
        while node is not None:
            node.usage = node.usage.after_descendant_reply(tokens, cost, estimated)
            node = node.parent

    def start_call(self, call_id: str) -> None:
        """A call is under way: its subtree's and every ancestor's tool-call budget counts it
        from now (a call started again, as after a crash, is counted once)."""
        if call_id in self.calls_out or call_id in self.tool_results:
            return
        if isinstance(self.calls_out, set):
            self.calls_out.add(call_id)
        else:
            self.calls_out = {call_id}
        for node in self.lineage():
            node.subtree_calls_out += 1

    def _end_all_calls(self) -> None:
        ended = len(self.calls_out)
        self.calls_out = NONE
        if ended:
            for node in self.lineage():
                node.subtree_calls_out -= ended

    def add_result(self, call_id: str, result: ToolResult) -> None:
        if call_id in self.calls_out:
            assert isinstance(self.calls_out, set)
            self.calls_out.discard(call_id)
            if not self.calls_out:
                self.calls_out = NONE
            for holder in self.lineage():
                holder.subtree_calls_out -= 1
        self.tool_results[call_id] = result
        if call_id in self.started:
            self.started = self.started - {call_id}
        if call_id in self.in_doubt:
            self.in_doubt = self.in_doubt - {call_id}
        self.usage = self.usage.after_call()
        node = self.parent
        while node is not None:
            node.usage = node.usage.after_descendant_call()
            node = node.parent

    def settle(self, result: TaskResult, state: HandleState, rollback_to: int, restored: tuple[InboxItem, ...]) -> None:
        """The run is over. A rolled-back run's messages leave the transcript and its drained
        inbox comes back; what it spent stays counted."""
        if rollback_to >= 0:
            self.inbox[0:0] = restored
            del self.transcript[rollback_to:]
            self.compactions = [compaction for compaction in self.compactions if compaction[0] <= rollback_to]
        self.last_result = result
        self.state = state
        self.pending = result.pending if result.status is Status.PENDING else None
        if state is not HandleState.SUSPENDED:
            self._end_all_calls()  # calls cut off with their run: never finished, never counted

    def rewind(self, to: int) -> None:
        """The transcript from `to` on leaves (a fork's change): the calls its messages made are
        forgotten (a later run's call of the same id is a new call), and those under way end."""
        dropped = {call.id for message in self.transcript[to:] for call in message.tool_calls}
        del self.transcript[to:]
        self.compactions = [compaction for compaction in self.compactions if compaction[0] <= to]
        self._end_all_calls()
        for call_id in dropped:
            self.tool_results.pop(call_id, None)
            self.tool_rounds.pop(call_id, None)
            self.tool_answers.pop(call_id, None)
            self.children_by_key.pop(call_id, None)
        self.started = self.started - dropped
        self.in_doubt = self.in_doubt - dropped
        self.approved = self.approved - dropped
        self.pending = None

    def set_budget(self, budget: Budget) -> None:
        self.budget = budget
        if budget.max_concurrent and self.gate is not None:
            self.gate.resize(budget.max_concurrent)
        elif budget.max_concurrent:
            self.gate = FifoGate(budget.max_concurrent)

    def close(self) -> None:
        self.state = HandleState.CLOSED
        self.pending = None
        self._end_all_calls()

    # ---- reads ---------------------------------------------------------------------------

    def result(
        self,
        status: Status,
        text: str = "",
        limit: Limit = Limit.NONE,
        is_error: bool = False,
        pending: PendingRequest | None = None,
        failure: Failure | None = None,
        output: Any = None,
    ) -> TaskResult:
        return TaskResult(
            handle_id=self.id,
            text=text,
            is_error=is_error,
            status=status,
            limit=limit,
            pending=pending,
            usage=self.usage,
            failure=failure,
            output=output,
            inherited=self.inherited,
        )

    def with_current_figures(self, result: TaskResult, status: Status | None = None) -> TaskResult:
        """A kept result re-read later: the figures are the handle's now (they never go down).
        Read under another status (a closed handle's last result reads CLOSED), only the text
        is kept: `limit` is set iff INCOMPLETE, `pending` iff PENDING, `failure` iff ERROR,
        `output` iff DONE."""
        status = status or result.status
        return self.result(
            status,
            result.text,
            result.limit if status is Status.INCOMPLETE else Limit.NONE,
            result.is_error and status is result.status,
            result.pending if status is Status.PENDING else None,
            result.failure if status is Status.ERROR else None,
            result.output if status is Status.DONE else None,
        )

    def snapshot(self) -> HandleSnapshot:
        return HandleSnapshot(
            handle_id=self.id,
            parent_id=self.parent_id,
            agent=self.agent.name,
            state=self.state,
            usage=self.usage,
            pending_kind=self.pending.kind if self.pending else "",
            inbox_size=len(self.inbox),
            budget=self.budget,
            last_status=self.last_result.status if self.last_result else Status.UNSPECIFIED,
            inherited=self.inherited,
        )
