"""The steps a fork and a replay record of their own (docs/fork-and-replay.md): where the
runtime came from, and the changes made at the cut. Like every step they are facts, applied
without I/O, so a fork restored from its journal is the fork that was made."""

from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary import Budget, HandleState, InboxItem
from .events import EventKind
from .handle import Handle
from .recording import Recording
from .tree import Tree

_Events = list[tuple[str, EventKind, dict[str, object]]]


def _hold(tree: Tree, handle: Handle) -> None:
    before = handle.state
    handle.state = HandleState.HELD
    handle.pending = None
    tree.changed_state(before, HandleState.HELD)


@dataclass(frozen=True)
class Forked:
    """A fork's first step after the copy of its source's journal: the source and the cut (the
    last event of the source the fork holds). Every handle's figures at the cut are what it
    inherited; the runs in flight at the cut are `held` until a Wake continues them; the
    agents `replaced` at the fork have their handles' budgets carved again (`budgets`)."""

    source: str
    at_seq: int
    replaced: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    budgets: tuple[tuple[str, Budget], ...] = ()

    def apply(self, tree: Tree) -> None:
        tree.origin = (self.source, self.at_seq)
        tree.replaying = None  # a fork of a replay answers its new calls as any runtime does
        for handle in tree.handles.values():
            handle.inherited = handle.usage
            handle.agent = tree.agents[handle.agent.name]
        for handle_id, budget in self.budgets:
            tree.handles[handle_id].set_budget(budget)
        for handle_id in self.held:
            _hold(tree, tree.handles[handle_id])

    def events(self) -> _Events:
        return [(handle_id, EventKind.STATE_CHANGED, {"state": HandleState.HELD}) for handle_id in self.held]


@dataclass(frozen=True)
class Held:
    """A change at a fork: a suspended handle whose Request the fork answered (Answered, just
    before) waits for a Wake to go on."""

    handle_id: str

    def apply(self, tree: Tree) -> None:
        _hold(tree, tree.handles[self.handle_id])

    def events(self) -> _Events:
        return [(self.handle_id, EventKind.STATE_CHANGED, {"state": HandleState.HELD})]


@dataclass(frozen=True)
class Rewound:
    """A change at a fork: a handle's last user message leaves its transcript, with every
    message after it (`to`: its index), and `item` goes to its inbox instead. A run held at
    the cut is given up (`idle`: the handle is IDLE, its next Wake runs on the item); what the
    dropped messages spent stays counted."""

    handle_id: str
    to: int
    item: InboxItem
    idle: bool = False

    def apply(self, tree: Tree) -> None:
        handle = tree.handles[self.handle_id]
        before = handle.state
        handle.rewind(self.to)
        if self.idle:
            handle.state = HandleState.IDLE
            tree.changed_state(before, HandleState.IDLE)
        handle.post(self.item)

    def events(self) -> _Events:
        return [(self.handle_id, EventKind.STATE_CHANGED, {"state": HandleState.IDLE})] if self.idle else []


@dataclass(frozen=True)
class Replaying:
    """A replay's first step: the recording it makes again (kept whole in the step, so the
    replay goes on after a restart even if the recording is deleted meanwhile)."""

    recording: Recording

    def apply(self, tree: Tree) -> None:
        tree.origin = (self.recording.source, 0)
        tree.replaying = self.recording

    def events(self) -> _Events:
        return []
