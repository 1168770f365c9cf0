"""A child run on behalf of a parent's run: a `task` call's team mate, a completion gate's
judge, a compaction's summarizer. The child is keyed by what asked for it, so a re-entered
call reattaches to the child it spawned and never spawns a duplicate."""

from __future__ import annotations

import asyncio

from ..errors import Detached, ResourceExhausted
from ..journal.handle import Handle
from ..vocabulary import HandleState, Limit, Status, TaskResult, ToolResult
from .driver import Run, RunHost


async def run_child(
    host: RunHost, handle: Handle, run: Run, key: str, agent_name: str, prompt: str, delegated: bool = True
) -> TaskResult | ToolResult:
    """Runs (or reattaches to) the child keyed by `key`; a refused spawn is an error result.
    Not `delegated`: a judge or a summarizer (budgets.carve)."""
    child = handle.children_by_key.get(key)
    runs = host.runs
    if child is None:
        try:
            child = await host.spawn_child(handle, host.tree.agents[agent_name], None, key=key, delegated=delegated)
        except ResourceExhausted as exc:
            # A budget's limit, or a tenant's quota (QUOTA_EXCEEDED): the model may judge it.
            why = exc.limit.wire_name if exc.limit is not Limit.NONE else exc.reason
            return ToolResult(f"not spawned: {exc} ({why})", is_error=True)
        await runs.start_run(child, prompt, parent_run=run)
    elif runs.get(child.id) is None and child.last_result is None and child.state is HandleState.IDLE:
        # Spawned, but its run never reached the journal (the process died between the two
        # steps): it never ran, so nothing of it can run twice. It runs now, on the same
        # prompt (the call's, or one rebuilt from the same transcript), instead of giving
        # the parent a never-run error.
        await runs.start_run(child, prompt, parent_run=run)
    if child not in run.children:
        run.children.append(child)
    child_run = runs.get(child.id)
    if child_run is not None and child_run.task is not None:
        if run.slot is None:
            result = await asyncio.shield(child_run.task)
        else:
            run.slot.leave()  # only waiting: the slot is lent out to the tenant's other handles
            try:
                result = await asyncio.shield(child_run.task)
            finally:
                run.slot.join()
        if result.status is Status.UNSPECIFIED:
            raise Detached  # the child stopped for shutdown: so does this run, unrecorded
        return result
    return host.settled_result(child)
