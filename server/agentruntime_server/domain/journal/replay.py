"""Replay: a tree rebuilt from its journal, the steps applied again in order. Recording a new
step applies it the same way (`apply`), so a replayed tree is the tree that was recorded."""

from __future__ import annotations

from collections.abc import Sequence

from .entry import Entry
from .replied import Replied
from .steps import Spawned, Step
from .tree import Tree


def replay(tree: Tree, entries: Sequence[Entry]) -> None:
    """Rebuilds a tree from its journal: the steps applied again, in order."""
    for entry in entries:
        apply(tree, entry.step, entry.at)


def apply(tree: Tree, step: Step, at: float) -> None:
    if isinstance(step, Replied):
        tree.replies.add(step, at)
        return
    step.apply(tree)
    if isinstance(step, Spawned) and tree.handles[step.handle_id].agent.heartbeat is not None:
        # A heartbeat's periods run from the spawn: those missed before a first tick (the
        # server down meanwhile) come due at the restart, counted, as later ones do.
        tree.handles[step.handle_id].last_tick = at
