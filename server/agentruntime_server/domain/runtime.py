"""One tree of handles and the verbs a host drives it with."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from . import budget as budgets
from .errors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound, ResourceExhausted
from .handle import Handle, Run
from .model import (
    AgentSpec,
    Answer,
    Budget,
    HandleSnapshot,
    HandleState,
    InboxItem,
    Limit,
    Message,
    Status,
    TaskResult,
)
from .ports import HttpToolRunner, ModelProvider, ProviderError, Store
from .prompts import wake_message


@dataclass(frozen=True)
class Services:
    """What a runtime needs from outside the domain."""

    models: ModelProvider
    http_tools: HttpToolRunner
    store: Store
    inbox_capacity: int = 100


class Runtime:
    def __init__(self, runtime_id: str, agents: tuple[AgentSpec, ...], services: Services) -> None:
        from .turns import TurnLoop  # the loop needs the runtime to spawn children

        self.id = runtime_id
        self.agents = {agent.name: agent for agent in agents}
        self.services = services
        self.handles: dict[str, Handle] = {}
        self._top_level_per_agent: dict[str, int] = {}
        self._loop = TurnLoop(self)

    # ---- lookups -------------------------------------------------------------------------

    def handle(self, handle_id: str) -> Handle:
        found = self.handles.get(handle_id)
        if found is None:
            raise NotFound("handle", handle_id, f"List runtime {self.id!r} to see its handles")
        return found

    def agent(self, name: str) -> AgentSpec:
        found = self.agents.get(name)
        if found is None:
            raise NotFound("agent", name, f"runtime {self.id!r} defines {sorted(self.agents)}")
        return found

    # ---- verbs ---------------------------------------------------------------------------

    async def spawn(self, parent_id: str, agent_name: str, budget_override: Budget | None) -> Handle:
        parent = None if parent_id == "root" else self.handle(parent_id)
        if parent is not None and parent.state is HandleState.CLOSED:
            raise FailedPrecondition(f"parent {parent.id!r} is closed")
        agent = self.agent(agent_name)
        if budget_override is not None:
            violations = budgets_violations(budget_override)
            if violations:
                raise InvalidArgument(violations)
        return await self.spawn_child(parent, agent, budget_override, key=None)

    async def spawn_child(
        self, parent: Handle | None, agent: AgentSpec, budget_override: Budget | None, key: str | None
    ) -> Handle:
        if parent is not None:
            budgets.check_spawn(parent)
        counters = parent.spawned_per_agent if parent else self._top_level_per_agent
        number = counters.get(agent.name, 0) + 1
        prefix = parent.id if parent else "root"
        handle_id = f"{prefix}/{agent.name}.{number}"
        own = agent.budget.overridden_by(budget_override) if budget_override else agent.budget
        handle = Handle(self.id, handle_id, parent, agent, budgets.carve(own, parent))
        counters[agent.name] = number
        self.handles[handle_id] = handle
        if parent is not None:
            parent.children.append(handle)
            if key is not None:
                parent.children_by_key[key] = handle
        await self.services.store.save_handle(self.id, handle.snapshot())
        return handle

    async def post(self, handle_id: str, text: str, channel: str, sender: str) -> int:
        handle = self.handle(handle_id)
        if handle.state is HandleState.CLOSED:
            raise FailedPrecondition(f"handle {handle_id!r} is closed; it takes no more messages")
        if not text:
            raise InvalidArgument([FieldViolation("text", "post a non-empty message")])
        if len(handle.inbox) >= self.services.inbox_capacity:
            raise ResourceExhausted(
                f"the inbox of {handle_id!r} is full ({self.services.inbox_capacity} messages); Wake it to drain the inbox",
                reason="INBOX_FULL",
            )
        handle.inbox.append(InboxItem(text=text, channel=channel, sender=sender or "host"))
        return len(handle.inbox)

    def wake(self, handle_id: str, prompt: str) -> bool:
        handle = self.handle(handle_id)
        self._check_wakeable(handle)
        if not prompt and not handle.inbox:
            raise InvalidArgument([FieldViolation("prompt", "the prompt is empty and the inbox is empty: nothing to run on")])
        self.start_run(handle, prompt)
        return True

    async def wait(self, handle_id: str, timeout: float | None) -> TaskResult:
        handle = self.handle(handle_id)
        run = handle.run
        if run is not None and run.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(run.task), timeout)
            except TimeoutError:
                return handle.result(Status.TIMEOUT, text=f"{handle_id!r} is still running")
        return self.settled_result(handle)

    def settled_result(self, handle: Handle) -> TaskResult:
        if handle.last_result is None:
            if handle.state is HandleState.CLOSED:
                return handle.result(Status.CLOSED)
            raise FailedPrecondition(f"handle {handle.id!r} has never been woken; Wake it first", reason="NEVER_RUN")
        if handle.state is HandleState.CLOSED:
            return handle.with_current_figures(handle.last_result, Status.CLOSED)
        return handle.with_current_figures(handle.last_result)

    async def interrupt(self, handle_id: str) -> bool:
        handle = self.handle(handle_id)
        return await self.stop_run(handle, (Status.INTERRUPTED, Limit.NONE))

    async def close(self, handle_id: str, force: bool) -> list[str]:
        handle = self.handle(handle_id)
        subtree = handle.subtree_leaf_first()
        busy = [node.id for node in subtree if node.run is not None]
        if busy and not force:
            raise FailedPrecondition(
                f"handles {busy} are running; Interrupt them first or Close with force", reason="HANDLE_RUNNING"
            )
        closed: list[str] = []
        for node in subtree:
            if node.state is HandleState.CLOSED:
                continue
            await self.stop_run(node, (Status.CLOSED, Limit.NONE))
            node.state = HandleState.CLOSED
            node.pending = None
            await self.services.store.save_handle(self.id, node.snapshot())
            closed.append(node.id)
        return closed

    async def resume(self, answer: Answer) -> TaskResult:
        raise FailedPrecondition(
            f"no live request has id {answer.id!r} in runtime {self.id!r}; Wait on a handle to see its pending request",
            reason="NO_SUCH_REQUEST",
        )

    def transcript(self, handle_id: str) -> list[Message]:
        return list(self.handle(handle_id).transcript)

    def inspect(self, handle_id: str) -> HandleSnapshot:
        return self.handle(handle_id).snapshot()

    def list(self) -> list[HandleSnapshot]:
        return [handle.snapshot() for handle in self.handles.values()]

    # ---- runs ----------------------------------------------------------------------------

    def _check_wakeable(self, handle: Handle) -> None:
        if handle.state is HandleState.CLOSED:
            raise FailedPrecondition(f"handle {handle.id!r} is closed; spawn a new one", reason="HANDLE_CLOSED")
        if handle.state is HandleState.SUSPENDED:
            kind = handle.pending.kind if handle.pending else "?"
            raise FailedPrecondition(
                f"handle {handle.id!r} is suspended on a {kind!r} request; answer it with Resume",
                reason="HANDLE_SUSPENDED",
            )
        if handle.run is not None:
            raise FailedPrecondition(
                f"handle {handle.id!r} is running; Post to its inbox, or Wait for it to settle",
                reason="HANDLE_RUNNING",
            )

    def start_run(self, handle: Handle, prompt: str, parent_run: Run | None = None) -> Run:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + handle.budget.max_wall_time if handle.budget.max_wall_time else None
        if parent_run is not None and parent_run.deadline is not None:
            deadline = parent_run.deadline if deadline is None else min(deadline, parent_run.deadline)
        run = Run(drained=list(handle.inbox), transcript_mark=len(handle.transcript), deadline=deadline)
        handle.inbox.clear()
        handle.state = HandleState.RUNNING
        handle.run = run
        run.task = loop.create_task(self._execute(handle, run, wake_message(prompt, run.drained)))
        return run

    async def stop_run(self, handle: Handle, stop: tuple[Status, Limit]) -> bool:
        """Cancels the handle's run, if any, and waits until it has settled."""
        run = handle.run
        if run is None or run.task is None:
            return False
        if run.stop is None:
            run.stop = stop
        run.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(run.task)
        return True

    async def _execute(self, handle: Handle, run: Run, prompt: Message) -> TaskResult:
        gate = handle.parent.gate if handle.parent else None
        holds_slot = False
        try:
            async with asyncio.timeout_at(run.deadline):
                if gate is not None:
                    await gate.acquire()
                    holds_slot = True
                await self.append_message(handle, prompt)
                result = await self._loop.drive(handle, run)
        except TimeoutError:
            result = handle.result(
                Status.INCOMPLETE, text=self._last_text(handle, "stopped at max_wall_time"), limit=Limit.MAX_WALL_TIME
            )
            await self._stop_descendants(run, (Status.INCOMPLETE, Limit.MAX_WALL_TIME))
        except asyncio.CancelledError:
            status, limit = run.stop or (Status.INTERRUPTED, Limit.NONE)
            await self._stop_descendants(run, (status, limit))
            result = handle.result(status, text=self._last_text(handle, status.name.lower()), limit=limit)
        except ProviderError as exc:
            await self._stop_descendants(run, (Status.INTERRUPTED, Limit.NONE))
            result = handle.result(Status.ERROR, text=f"model call failed: {exc}", is_error=True)
        finally:
            if holds_slot and gate is not None:
                gate.release()
        await self._settle(handle, run, result)
        return result

    async def _stop_descendants(self, run: Run, stop: tuple[Status, Limit]) -> None:
        for child in run.children:
            await self.stop_run(child, stop)

    async def _settle(self, handle: Handle, run: Run, result: TaskResult) -> None:
        if result.status is Status.INTERRUPTED:
            # The run is rolled back: its drained messages go back to the inbox, its
            # transcript entries are dropped; what it spent stays counted.
            handle.inbox.extendleft(reversed(run.drained))
            del handle.transcript[run.transcript_mark :]
            await self.services.store.truncate_transcript(self.id, handle.id, run.transcript_mark)
        elif result.status is not Status.PENDING:
            await self._answer_dangling_calls(handle, f"not run: the run stopped ({result.status.name})")
        handle.last_result = result
        handle.run = None
        if handle.state is not HandleState.CLOSED:
            handle.state = HandleState.SUSPENDED if result.status is Status.PENDING else HandleState.IDLE
        if result.status is Status.CLOSED:
            handle.state = HandleState.CLOSED
        await self.services.store.save_handle(self.id, handle.snapshot())

    async def _answer_dangling_calls(self, handle: Handle, reason: str) -> None:
        """Keeps the transcript well formed: every tool call made gets a tool message."""
        if not handle.transcript or not handle.transcript[-1].tool_calls:
            return
        for call in handle.transcript[-1].tool_calls:
            await self.append_message(
                handle, Message(role="tool", content=reason, tool_call_id=call.id, is_error=True)
            )

    async def append_message(self, handle: Handle, message: Message) -> None:
        handle.transcript.append(message)
        await self.services.store.append_message(self.id, handle.id, message)

    @staticmethod
    def _last_text(handle: Handle, fallback: str) -> str:
        for message in reversed(handle.transcript):
            if message.role == "assistant" and message.content:
                return message.content
        return fallback


def budgets_violations(budget: Budget) -> list[FieldViolation]:
    from .validation import check_budget

    return check_budget(budget, "budget")

