"""Resume: an Answer continues the run that waits for it from its checkpoint (the assistant
message that made the calls is in the transcript, finished calls come from the journal), then
the parent's pending task call, up the chain; the result is the topmost handle's. A retried
Resume (the same answer) gets the same result and runs nothing again."""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..errors import FailedPrecondition, Unavailable, shown
from ..journal import Answered, BudgetSet, CallFinished, Journal, Replied, Settled, Step, Tree
from ..journal.handle import Handle
from ..ports import Services
from ..runs import budgets
from ..runs.driver import Run, RunDriver, dangling_answers
from ..suspension.answers import AnswerOutcome, read_answer
from ..tenancy.quotas import Tenancy
from ..vocabulary import Answer, HandleState, Limit, Status, TaskResult
from .request_ids import RequestKey


class ResumeHost(Protocol):
    """What resuming needs from its runtime."""

    id: str
    tenant: str
    tenancy: Tenancy | None
    tree: Tree
    journal: Journal
    services: Services
    runs: RunDriver

    def handle(self, handle_id: str) -> Handle: ...

    def settled_result(self, handle: Handle) -> TaskResult: ...


def answered_steps(leaf: Handle, answer: Answer, outcome: AnswerOutcome) -> list[Step]:
    """What an answer that does not decline records: the answer, a budget it extends, and the
    results it gives (a Resume, or a change at a fork: forks.py)."""
    assert leaf.pending is not None
    calls = {call.id: call for call, _ in leaf.pending.calls}
    extension: list[Step] = []
    if outcome.extend:
        budget = budgets.extended(leaf, outcome.extend)
        budgets.check_raised(leaf, budget, str(leaf.pending.data.get("field", "")))
        extension = [BudgetSet(leaf.id, budget)]
    return [
        Answered(answer.id, answer, leaf.id, tuple(outcome.approved), tuple(outcome.rerun), tuple(outcome.for_tool)),
        *extension,
        *(CallFinished(leaf.id, calls[call_id], result) for call_id, result in outcome.results),
    ]


def declined_steps(leaf: Handle, answer: Answer) -> list[Step]:
    """What a declined budget Request records: the run stops there, as a STOP budget would."""
    assert leaf.pending is not None
    limit = next((limit for limit in Limit if limit.wire_name == leaf.pending.data.get("limit")), Limit.MAX_TURNS)
    result = leaf.result(Status.INCOMPLETE, text=f"stopped at {limit.wire_name}", limit=limit)
    return [
        Answered(answer.id, answer, leaf.id),
        Settled(leaf.id, result, HandleState.IDLE),
        *dangling_answers(leaf, leaf.transcript, f"not run: the run stopped at {limit.wire_name}"),
    ]


class Resumes:
    def __init__(self, host: ResumeHost) -> None:
        self.host = host  # a weak proxy: nothing the runtime holds refers back to it
        # Resumes answered by this process: request id -> the run the answer continued.
        self.following: dict[str, Run] = {}

    async def answer(self, answer: Answer, lapsed: bool, request: RequestKey | None) -> TaskResult:
        """Continues the run that waits for the answer, from its checkpoint (`lapsed`: the
        Request expired: an error result, however full the tenant's store is)."""
        leaf = self.host.tree.requests.get(answer.id)
        if leaf is None or leaf.pending is None:
            return await self.retried(answer)
        # A bad answer is refused before any change.
        outcome = read_answer(leaf.pending, answer, self.host.services.limits, self.host.services.clock.time())
        if self.host.tenancy is not None and not outcome.declined:
            self.host.tenancy.check_running(self.host.tenant)  # a Resume starts a run, as a Wake does
            if not lapsed:
                await self.host.tenancy.check_store(self.host.tenant)
        replied = [request.replied("Resume")] if request else []
        if outcome.declined:
            return await self._stop_at_budget(leaf, answer, replied)
        await self.host.journal.record(*answered_steps(leaf, answer, outcome), *replied)
        run = await self.host.runs.continue_run(leaf)
        self.following[answer.id] = run
        try:
            return await self._follow(run)
        finally:
            # A retry after the chain settled reads the settled result (_retried_resume).
            self.following.pop(answer.id, None)

    async def _stop_at_budget(self, leaf: Handle, answer: Answer, replied: list[Replied]) -> TaskResult:
        """The host declined to extend a budget: the run stops there, as a STOP budget would."""
        await self.host.journal.record(*declined_steps(leaf, answer), *replied)
        run = await self.host.runs.continue_waiting_parent(leaf)
        if run is None:
            return self.host.settled_result(leaf)
        self.following[answer.id] = run
        return await self._follow(run)

    async def retried(self, answer: Answer) -> TaskResult:
        """A retried Resume: the same answer gets the same result and runs nothing again."""
        earlier = self.host.tree.answered.get(answer.id)
        if earlier is None:
            raise FailedPrecondition(
                f"no live request has id {shown(answer.id)} in runtime {self.host.id!r}; "
                "Wait on the root handle to see its pending request",
                reason="NO_SUCH_REQUEST",
            )
        if earlier[0] != answer:
            raise FailedPrecondition(
                f"request {shown(answer.id)} was already answered with a different answer; it cannot be answered twice",
                reason="ALREADY_ANSWERED",
            )
        run = self.following.get(answer.id)
        if run is not None:
            return await self._follow(run)
        # The topmost handle the first Resume's chain of continued runs reached (the journal
        # tells, so also after a restart); while it still runs, the chain goes on from it.
        topmost = self.host.handle(self.host.tree.resumed_top.get(answer.id, earlier[1]))
        run = self.host.runs.get(topmost.id)
        if run is not None and run.task is not None:
            return await self._follow(run)
        return self.host.settled_result(topmost)

    @staticmethod
    async def _follow(run: Run) -> TaskResult:
        """The settled result of the topmost handle a Resume continued, up the chain of parents."""
        assert run.task is not None
        result = await asyncio.shield(run.task)
        while run.next is not None:
            run = run.next
            assert run.task is not None
            result = await asyncio.shield(run.task)
        if result.status is Status.UNSPECIFIED:
            raise Unavailable("the server is shutting down; Resume again (the same answer) at its replacement")
        return result
