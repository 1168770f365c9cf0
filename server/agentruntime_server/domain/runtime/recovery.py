"""Recovery: what a runtime had running when its last process stopped (a crash, a shutdown,
a replica whose lease lapsed) goes on from its journal, in the process that takes it over."""

from __future__ import annotations

from typing import Protocol

from ..journal import InDoubt, Journal, Tree
from ..journal.handle import Handle
from ..runs.driver import RunDriver
from ..vocabulary import HandleState, Message, ToolCall


class RecoveryHost(Protocol):
    tree: Tree
    journal: Journal
    runs: RunDriver


async def continue_interrupted(host: RecoveryHost) -> int:
    """Continues every handle that was RUNNING when the process died, from its journal; how many.

    A call started but never recorded is in doubt: its tool's on_interrupted policy
    decides (RETRY: it runs again with the same idempotency key; ASK: the host decides).
    Children are continued before their parents, so a parent re-entering its tool
    phase reattaches to the child's run instead of reading a stale result."""
    running = [h for h in host.tree.handles.values() if h.state.in_flight]
    for handle in sorted(running, key=lambda h: h.seq, reverse=True):
        await continue_held(host, handle)
    return len(running)


def held_in_tree(handle: Handle) -> list[Handle]:
    """The handles held at a fork's cut in the handle's top-level tree, children first."""
    top = handle
    while top.parent is not None:
        top = top.parent
    held = [node for node in top.subtree_leaf_first() if node.state is HandleState.HELD]
    return sorted(held, key=lambda node: node.seq, reverse=True)


async def continue_held(host: RecoveryHost, handle: Handle) -> None:
    """One handle's run goes on from its journal: after a restart, or held at a fork's cut."""
    asking = []
    for call_id in sorted(handle.started - set(handle.tool_results)):
        call = _find_call(handle.transcript, call_id)
        spec = handle.agent.tool(call.name) if call else None
        if spec is not None and spec.asks_when_in_doubt:
            asking.append(call_id)
    if asking:
        await host.journal.record(InDoubt(handle.id, tuple(asking)))
    await host.runs.continue_run(handle)


def _find_call(transcript: list[Message], call_id: str) -> ToolCall | None:
    for message in reversed(transcript):
        for call in message.tool_calls:
            if call.id == call_id:
                return call
    return None
