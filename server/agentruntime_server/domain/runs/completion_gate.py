"""The completion gate: a final answer is accepted only if it matches the agent's pattern
and, with a judge agent, the judge says PASS."""

from __future__ import annotations

from ..definitions import patterns
from ..errors import shown
from ..journal.handle import Handle
from ..vocabulary import PendingRequest, Status, TaskResult, ToolResult
from . import prompts
from .delegation import run_child
from .driver import Run, RunHost


async def rejection(host: RunHost, handle: Handle, run: Run, text: str) -> str | PendingRequest | None:
    """None when the final answer is accepted, else the reason it was not; or the judge's
    Request when the judge suspended (the handle suspends on it, as on a task call, and
    reads the verdict when it goes on)."""
    gate = handle.agent.completion
    if gate.must_match and not patterns.search(gate.must_match, text):
        return f"the answer does not match {shown(gate.must_match)}"
    if gate.judge_agent:
        # The task is the message the run started on (a continued run's mark is later on).
        task = next((m.content for m in reversed(handle.transcript[: handle.run_start + 1]) if m.role == "user"), "")
        verdict = await run_child(
            host,
            handle,
            run,
            key=f"judge_turn_{handle.usage.turns}",
            agent_name=gate.judge_agent,
            prompt=prompts.judge_prompt(task, text),
            delegated=False,
        )
        if isinstance(verdict, TaskResult) and verdict.status is Status.PENDING and verdict.pending is not None:
            return verdict.pending
        verdict_text = verdict.output if isinstance(verdict, ToolResult) else verdict.text
        if not verdict_text.strip().startswith("PASS"):
            return f"the judge {gate.judge_agent!r} said: {verdict_text.strip() or '(nothing)'}"
    return None
