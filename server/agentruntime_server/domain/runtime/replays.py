"""A replay: a recorded runtime's root runs made again, in a new runtime, with other
definitions; its tool calls answered from the recording where they match (runs/tool_phase.py
asks `Recording.answer`), then the two compared, root by root. docs/fork-and-replay.md"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from ..journal import Entry, Replaying, RunStarted, Spawned, Step, Tree
from ..journal.handle import Handle
from ..journal.recording import Recording, ReplayRoot
from ..vocabulary import AgentSpec, HandleState, Message, RecordedCall, Status, TaskResult, UnrecordedCalls
from .runtime import Runtime

Call = tuple[str, str, str]  # handle id, name, arguments


@dataclass(frozen=True)
class RootDiff:
    handle_id: str
    recorded: TaskResult | None
    replayed: TaskResult | None
    recorded_calls: tuple[Call, ...]
    replayed_calls: tuple[Call, ...]
    changed: tuple[str, ...]


def recorded_calls(tree: Tree) -> tuple[RecordedCall, ...]:
    """Every tool call of the recording that has a result (a `task` call's is its child's run,
    which the replay makes again), with its place."""
    found = []
    for handle in tree.handles.values():
        place = 0
        for message in handle.transcript:
            for call in message.tool_calls:
                result = handle.tool_results.get(call.id)
                if result is not None and call.name != "task":
                    found.append(RecordedCall(handle.id, place, call.name, call.arguments_json, result))
                place += 1
    return tuple(found)


def subtree_calls(tree: Tree, root_id: str) -> tuple[Call, ...]:
    root = tree.handles.get(root_id)
    if root is None:
        return ()
    nodes = sorted(_subtree(root), key=lambda node: node.seq)
    return tuple(
        (node.id, call.name, call.arguments_json) for node in nodes for message in node.transcript for call in message.tool_calls
    )


def _subtree(handle: Handle) -> list[Handle]:
    return [handle, *(node for child in handle.children for node in _subtree(child))]


def plan(
    tree: Tree, entries: Sequence[Entry], agents: dict[str, AgentSpec], replaced: Sequence[str], unrecorded: UnrecordedCalls
) -> Recording:
    """What the replay makes again: every top-level handle of the recording, spawned as it was
    (a replaced agent's with its replacement's budget), and the runs started on a message, in
    order; with the recorded results and calls the diff compares with."""
    messages: dict[str, list[Message]] = {}
    spawns: list[Spawned] = []
    for entry in entries:
        step = entry.step
        if isinstance(step, Spawned) and not step.parent_id:
            spawns.append(step)
            messages[step.handle_id] = []
        elif isinstance(step, RunStarted) and step.message is not None and step.handle_id in messages:
            messages[step.handle_id].append(step.message)
    roots = []
    for spawned in spawns:
        handle = tree.handles[spawned.handle_id]
        budget = agents[spawned.agent].budget if spawned.agent in replaced else spawned.budget
        recorded = handle.with_current_figures(handle.last_result) if handle.last_result is not None else None
        roots.append(
            ReplayRoot(
                spawned.handle_id,
                spawned.agent,
                budget,
                spawned.number,
                tuple(messages[spawned.handle_id]),
                recorded,
                subtree_calls(tree, spawned.handle_id),
            )
        )
    return Recording(tree.runtime_id.rpartition(":")[2], unrecorded, recorded_calls(tree), tuple(roots))


def first_steps(recording: Recording) -> list[Step]:
    """The replay's own first steps: the recording it replays, and its roots spawned."""
    return [
        Replaying(recording),
        *(Spawned(root.handle_id, "", root.agent, root.budget, "", root.number) for root in recording.roots),
    ]


def driving(runtime: Runtime) -> asyncio.Task[None]:
    """The task that takes the replay's roots through their recorded runs (one per runtime copy:
    a second ReplayRuntime call, or one after a restart, waits on the same, or starts it again
    where the journal says the replay is)."""
    task = runtime.replay_driver
    if task is None or (task.done() and not _finished(runtime)):
        task = runtime.replay_driver = asyncio.get_running_loop().create_task(_drive(runtime))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


def _finished(runtime: Runtime) -> bool:
    replaying = runtime.tree.replaying
    return replaying is None or all(_root_done(runtime, root) for root in replaying.roots)


def _root_done(runtime: Runtime, root: ReplayRoot) -> bool:
    """Nothing more for the driver to start: every recorded run made, or the root stopped
    (waiting for the host, closed, or a run that did not end DONE)."""
    handle = runtime.tree.handles.get(root.handle_id)
    if handle is None:
        return True
    if runtime.runs.get(handle.id) is not None or handle.state.in_flight:
        return False
    if handle.state is not HandleState.IDLE:
        return True
    return handle.runs >= len(root.messages) or (handle.runs > 0 and _stopped(handle))


def _stopped(handle: Handle) -> bool:
    """A run that did not end DONE leaves the root's later recorded runs unmade (they followed
    on a result the replay did not reach)."""
    return handle.last_result is not None and handle.last_result.status is not Status.DONE


async def _drive(runtime: Runtime) -> None:
    replaying = runtime.tree.replaying
    if replaying is None:
        return
    await asyncio.gather(*(_drive_root(runtime, root) for root in replaying.roots))


async def _drive_root(runtime: Runtime, root: ReplayRoot) -> None:
    handle = runtime.tree.handles.get(root.handle_id)
    while handle is not None and not runtime.draining:
        run = runtime.runs.get(handle.id)
        if run is not None and run.task is not None:
            await asyncio.shield(run.task)
            continue
        if _root_done(runtime, root) or handle.state.in_flight:
            return  # (in flight with no run here: its copy is not taken over, and its run goes on where it is)
        await runtime.runs.start_recorded_run(handle, root.messages[handle.runs])


def settled(runtime: Runtime) -> bool:
    return _finished(runtime) and not any(handle.state.in_flight for handle in runtime.tree.handles.values())


def diffs(runtime: Runtime) -> list[RootDiff]:
    replaying = runtime.tree.replaying
    if replaying is None:
        return []
    found = []
    for root in replaying.roots:
        handle = runtime.tree.handles.get(root.handle_id)
        replayed = None
        if handle is not None and handle.last_result is not None:
            replayed = handle.with_current_figures(handle.last_result)
        calls = subtree_calls(runtime.tree, root.handle_id)
        found.append(
            RootDiff(
                root.handle_id, root.recorded, replayed, root.calls, calls, _changed(root.recorded, replayed, root.calls, calls)
            )
        )
    return found


def _changed(
    recorded: TaskResult | None, replayed: TaskResult | None, recorded_calls: tuple[Call, ...], replayed_calls: tuple[Call, ...]
) -> tuple[str, ...]:
    def read(result: TaskResult | None) -> dict[str, object]:
        if result is None:
            return {name: None for name in FIELDS}
        usage = result.usage
        return {
            "status": result.status,
            "limit": result.limit,
            "turns": usage.turns,
            "own_tokens": usage.own_tokens,
            "total_tokens": usage.total_tokens,
            "cost": (usage.total_cost.micros, usage.total_cost.currency),
            "text": result.text,
            "output": result.output,
        }

    before, after = read(recorded), read(replayed)
    changed = [name for name in FIELDS if before[name] != after[name]]
    if recorded_calls != replayed_calls:
        changed.append("tool_calls")
    return tuple(changed)


FIELDS = ("status", "limit", "turns", "own_tokens", "total_tokens", "cost", "text", "output")
