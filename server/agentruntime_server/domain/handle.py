"""One live agent in a tree: its state, figures, transcript and current run."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from .model import (
    AgentSpec,
    Budget,
    HandleRecord,
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


class FifoGate:
    """At most `capacity` holders; waiters enter strictly in arrival order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.held < self.capacity and not self._waiters:
            self.held += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter: `held` is unchanged
                return
        self.held -= 1


@dataclass
class Run:
    """One Wake (or task call) of a handle, until it settles."""

    drained: list[InboxItem]
    transcript_mark: int
    deadline: float | None  # event-loop time
    task: asyncio.Task[TaskResult] | None = None
    # Set by whoever cancels the run, so the run knows how to settle.
    stop: tuple[Status, Limit] | None = None
    gate_attempts: int = 0
    children: list[Handle] = field(default_factory=list)
    # The parent's run that this run's settling continued (Resume follows the chain up).
    next: Run | None = None
    shutdown: bool = False  # cancelled because the process stops: not settled


class Handle:
    def __init__(
        self,
        runtime_id: str,
        handle_id: str,
        parent: Handle | None,
        agent: AgentSpec,
        budget: Budget,
        child_key: str = "",
        seq: int = 0,
    ) -> None:
        self.runtime_id = runtime_id
        self.id = handle_id
        self.parent = parent
        self.agent = agent
        self.budget = budget
        self.child_key = child_key  # the parent's call id (or judge key) that spawned it
        self.seq = seq  # spawn order within the runtime
        self.depth: int = parent.depth + 1 if parent else 1
        self.state = HandleState.IDLE
        self.turns = 0
        self.own_tokens = 0
        self.total_tokens = 0
        self.tool_calls = 0
        self.subtree_tool_calls = 0
        self.children: list[Handle] = []
        self.spawned_per_agent: dict[str, int] = {}
        self.children_by_key: dict[str, Handle] = {}
        self.inbox: deque[InboxItem] = deque()
        self.transcript: list[Message] = []
        self.tool_results: dict[str, ToolResult] = {}
        self.last_result: TaskResult | None = None
        # The Request this handle presents while SUSPENDED: its own, or a suspended child's.
        self.pending: PendingRequest | None = None
        self.approved: set[str] = set()
        # Calls that were in flight when the process died and whose tool says ASK.
        self.in_doubt: set[str] = set()
        self.run: Run | None = None
        self.gate = FifoGate(budget.max_concurrent) if budget.max_concurrent else None

    @property
    def parent_id(self) -> str:
        return self.parent.id if self.parent else "root"

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

    def result(
        self,
        status: Status,
        text: str = "",
        limit: Limit = Limit.NONE,
        is_error: bool = False,
        pending: PendingRequest | None = None,
    ) -> TaskResult:
        return TaskResult(
            handle_id=self.id,
            text=text,
            is_error=is_error,
            status=status,
            limit=limit,
            pending=pending,
            turns=self.turns,
            total_tokens=self.total_tokens,
            own_tokens=self.own_tokens,
            tool_calls=self.tool_calls,
        )

    def with_current_figures(self, result: TaskResult, status: Status | None = None) -> TaskResult:
        """A kept result re-read later: the figures are the handle's now (they never go down)."""
        return self.result(status or result.status, result.text, result.limit, result.is_error, result.pending)

    def lineage_figures(self) -> list[tuple[str, int, int, int, int, int]]:
        """The counters a journal step changes, for the handle and each ancestor."""
        return [
            (node.id, node.turns, node.own_tokens, node.total_tokens, node.tool_calls, node.subtree_tool_calls)
            for node in self.lineage()
        ]

    def record(self) -> HandleRecord:
        return HandleRecord(
            handle_id=self.id,
            parent_id=self.parent.id if self.parent else "",
            agent=self.agent.name,
            budget=self.budget,
            child_key=self.child_key,
            seq=self.seq,
            state=self.state,
            turns=self.turns,
            own_tokens=self.own_tokens,
            total_tokens=self.total_tokens,
            tool_calls=self.tool_calls,
            subtree_tool_calls=self.subtree_tool_calls,
            inbox=tuple(self.inbox),
            last_result=self.last_result,
            pending=self.pending,
            approved=tuple(sorted(self.approved)),
            in_doubt=tuple(sorted(self.in_doubt)),
        )

    @classmethod
    def restore(cls, runtime_id: str, record: HandleRecord, parent: Handle | None, agent: AgentSpec) -> Handle:
        handle = cls(runtime_id, record.handle_id, parent, agent, record.budget, record.child_key, record.seq)
        handle.state = record.state
        handle.turns = record.turns
        handle.own_tokens = record.own_tokens
        handle.total_tokens = record.total_tokens
        handle.tool_calls = record.tool_calls
        handle.subtree_tool_calls = record.subtree_tool_calls
        handle.inbox.extend(record.inbox)
        handle.last_result = record.last_result
        handle.pending = record.pending
        handle.approved = set(record.approved)
        handle.in_doubt = set(record.in_doubt)
        if parent is not None:
            parent.children.append(handle)
            number = int(record.handle_id.rsplit(".", 1)[1])
            parent.spawned_per_agent[agent.name] = max(parent.spawned_per_agent.get(agent.name, 0), number)
            if record.child_key:
                parent.children_by_key[record.child_key] = handle
        return handle

    def snapshot(self) -> HandleSnapshot:
        return HandleSnapshot(
            handle_id=self.id,
            parent_id=self.parent_id,
            agent=self.agent.name,
            state=self.state,
            turns=self.turns,
            total_tokens=self.total_tokens,
            own_tokens=self.own_tokens,
            tool_calls=self.tool_calls,
            pending_kind=self.pending.kind if self.pending else "",
            inbox_size=len(self.inbox),
            budget=self.budget,
            last_status=self.last_result.status if self.last_result else Status.UNSPECIFIED,
        )
