"""The steps a store migration writes for a store of release 0.1.0 (before the journal):
a handle's whole state, and the events it kept, at once."""

from __future__ import annotations

from dataclasses import dataclass

from ..billing.usage import Usage
from ..vocabulary import HandleState, InboxItem, Message, PendingRequest, TaskResult, ToolResult
from .events import Event, EventKind
from .tree import Tree


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
        tree.spent(self.usage.own_split, self.usage.own_cost)
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
