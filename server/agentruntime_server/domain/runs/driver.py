"""Running a handle's runs: a Wake, a task call, a Resume or a recovery starts or continues
one, as an asyncio task, until it settles (or is stopped, or detached at shutdown).

The runs in flight are this process's alone: the run driver keeps them, keyed by handle id,
apart from the tree the journal replays. Restoring a runtime creates no run; only a runtime
this process has taken over starts one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import Detached, StoreUnavailable
from ..fifo_gate import FifoGate
from ..journal import Journal, MessagesAppended, Queued, RunStarted, Settled, Step, Tree
from ..journal.handle import Handle
from ..ports import ProviderError, Services
from ..tenancy.quotas import RunningSlot, Tenancy
from ..vocabulary import (
    AgentSpec,
    Budget,
    Failure,
    FailureReason,
    HandleState,
    InboxItem,
    Limit,
    Message,
    PendingRequest,
    Status,
    TaskResult,
)
from ..watching.event_log import EventLog
from .prompts import wake_message

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One Wake (or task call) of a handle, until it settles."""

    drained: list[InboxItem]
    transcript_mark: int
    deadline: float | None  # the clock's monotonic time
    task: asyncio.Task[TaskResult] | None = None
    # Set by whoever cancels the run, so the run knows how to settle.
    stop: tuple[Status, Limit] | None = None
    # Stopped with an ancestor (its Interrupt or Close): settling does not continue the
    # suspended parent, which is being stopped too.
    quiet: bool = False
    children: list[Handle] = field(default_factory=list)
    # The parent's run that this run's settling continued (Resume follows the chain up).
    next: Run | None = None
    shutdown: bool = False  # cancelled because the process stops: not settled
    # A task cancelled before its first step never runs a line of it: a stop before `started`
    # is left in `stop` for the run to see first. Past its work (`settling`), a stop waits for
    # it: a cancel landing in its settling (a second Interrupt, a Close racing one) would end
    # the task. Either way the handle would be left RUNNING, and a Wait on it cancelled.
    started: bool = False
    settling: bool = False
    slot: RunningSlot | None = None  # its hold on a running slot of its tenant's quota, if the tenant has one


class Turns(Protocol):
    async def drive(self, handle: Handle, run: Run) -> TaskResult: ...


class LapseTimers(Protocol):
    def arm_lapse(self, request: PendingRequest, at_least: float = 0.0) -> None: ...


class DriverHost(Protocol):
    """What the run driver needs from its runtime."""

    key: str
    tenant: str
    tenancy: Tenancy | None
    journal: Journal
    turns: Turns
    timers: LapseTimers
    services: Services


class RunHost(Protocol):
    """What running a handle's turns (turns.py, tool_phase.py) needs from its runtime."""

    id: str
    key: str
    tenant: str
    tenancy: Tenancy | None
    tree: Tree
    journal: Journal
    events: EventLog
    services: Services
    draining: bool
    runs: RunDriver

    async def spawn_child(
        self, parent: Handle | None, agent: AgentSpec, budget_override: Budget | None, key: str | None, delegated: bool = True
    ) -> Handle: ...

    def settled_result(self, handle: Handle) -> TaskResult: ...

    @property
    def model_gate(self) -> FifoGate | None: ...

    async def tokens_left(self) -> int | None: ...

    async def cost_left(self) -> int | None: ...

    async def spend(self, tokens: int, micros: int = 0) -> None: ...


async def _record_queued(journal: Journal, handle_id: str, queued: bool) -> None:
    await journal.record(Queued(handle_id, queued))


def closed_ancestor(handle: Handle) -> Handle | None:
    """A closed handle's subtree runs no more (a store written before Close listed the
    subtree again after its grace may hold an open child under a closed parent)."""
    return next((node for node in handle.lineage() if node.state is HandleState.CLOSED), None)


class RunDriver:
    def __init__(self, host: DriverHost) -> None:
        self.host = host  # a weak proxy: nothing the runtime holds refers back to it
        self._runs: dict[str, Run] = {}  # handle id -> its run in flight

    def get(self, handle_id: str) -> Run | None:
        return self._runs.get(handle_id)

    @property
    def in_flight(self) -> bool:
        return bool(self._runs)

    def tasks(self) -> list[asyncio.Task[TaskResult]]:
        return [run.task for run in self._runs.values() if run.task is not None]

    async def queue_for(self, handle: Handle, gate: FifoGate) -> None:
        """Takes a slot of the gate; a handle that has to wait shows QUEUED meanwhile."""
        if not gate.would_wait:
            await gate.acquire()
            return
        await self.host.journal.record(Queued(handle.id, True))
        await gate.acquire()
        await self.host.journal.record(Queued(handle.id, False))

    async def start_run(self, handle: Handle, prompt: str, parent_run: Run | None = None, also: Sequence[Step] = ()) -> Run:
        """A new run on the prompt and the drained inbox, journaled before it is acknowledged
        (with `also`: what the call that started it records with it, its answer)."""
        run = self._begin(handle, list(handle.inbox), parent_run)
        await self.host.journal.record(RunStarted(handle.id, wake_message(prompt, run.drained), len(run.drained)), *also)
        run.task = asyncio.get_running_loop().create_task(self._execute(handle, run))
        return run

    async def start_recorded_run(self, handle: Handle, message: Message) -> Run:
        """A new run on a message a recording started one on (a replay: replays.py)."""
        run = self._begin(handle, [], None)
        await self.host.journal.record(RunStarted(handle.id, message))
        run.task = asyncio.get_running_loop().create_task(self._execute(handle, run))
        return run

    async def continue_run(self, handle: Handle) -> Run:
        """Re-enters a handle's turn from its transcript and journal (after a Resume or a restart)."""
        run = self._begin(handle, [], None)
        await self.host.journal.record(RunStarted(handle.id, None))
        run.task = asyncio.get_running_loop().create_task(self._execute(handle, run))
        return run

    def _begin(self, handle: Handle, drained: list[InboxItem], parent_run: Run | None) -> Run:
        now = self.host.services.clock.monotonic()
        deadline = now + handle.budget.max_wall_time if handle.budget.max_wall_time else None
        if parent_run is not None and parent_run.deadline is not None:
            deadline = parent_run.deadline if deadline is None else min(deadline, parent_run.deadline)
        # An interrupted run rolls back to here: for a new run, to just before its prompt.
        run = Run(drained=drained, transcript_mark=len(handle.transcript), deadline=deadline)
        self._runs[handle.id] = run
        return run

    async def continue_waiting_parent(self, child: Handle) -> Run | None:
        """A child whose suspended parent waits on it has settled: the parent goes on."""
        parent = child.parent
        if parent is None or parent.state is not HandleState.SUSPENDED or not child.child_key:
            return None
        return await self.continue_run(parent)

    async def detach_all(self) -> None:
        """Process shutdown (or a copy that lost its lease): every run is cancelled without
        settling (it goes on from its journal wherever the runtime is taken over next)."""
        runs = list(self._runs.values())
        for run in runs:
            run.shutdown = True
            if run.task is not None:
                run.task.cancel()
        await asyncio.gather(*(run.task for run in runs if run.task is not None), return_exceptions=True)

    # ---- stopping ------------------------------------------------------------------------

    async def stop_run(self, handle: Handle, stop: tuple[Status, Limit], quiet: bool = False) -> bool:
        """Cancels the handle's run, if any, and waits until it has settled. `quiet`: it is
        stopped with its ancestors, and its settling does not continue a suspended parent."""
        run = self._runs.get(handle.id)
        if run is None or run.task is None:
            return False
        run.quiet = run.quiet or quiet
        if run.stop is None and not run.settling:
            run.stop = stop
            if run.started:
                run.task.cancel()  # once: the run settles on the first stop; a later one waits for that
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(run.task)
        return True

    async def withdraw(self, top: Handle, stop: tuple[Status, Limit], continue_parent: bool) -> None:
        """Stops a subtree that is not running as a whole (`top` suspended, or a stopped run's
        child): what runs in it stops, leaf first (a child continued by a Resume under a
        suspended parent), then every suspension in it is cancelled, leaf first. Only `top`'s
        settling may continue its parent, and only with `continue_parent`."""
        for node in top.subtree_leaf_first():
            if node.id in self._runs:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.stop_run(node, stop, quiet=True)
        for node in top.subtree_leaf_first():
            if node.state is HandleState.SUSPENDED:
                with contextlib.suppress(asyncio.CancelledError):  # a half-withdrawn subtree would keep live Requests
                    await self.cancel_suspension(node, stop, continue_parent=continue_parent and node is top)

    async def cancel_suspension(self, handle: Handle, stop: tuple[Status, Limit], continue_parent: bool) -> None:
        """Interrupt/Close of a SUSPENDED handle (or of a run it works for): its Request is
        withdrawn, Wait tells why."""
        status, limit = stop
        kind = handle.pending.kind if handle.pending else "?"
        result = handle.result(status, text=f"the pending {kind} request was cancelled", limit=limit)
        state = HandleState.CLOSED if status is Status.CLOSED else HandleState.IDLE
        reason = f"not run: the pending {kind} request was cancelled ({status.name})"
        await self.host.journal.record(*dangling_answers(handle, handle.transcript, reason), Settled(handle.id, result, state))
        if continue_parent:
            await self.continue_waiting_parent(handle)

    # ---- one run -------------------------------------------------------------------------

    async def _execute(self, handle: Handle, run: Run) -> TaskResult:
        host = self.host
        gate = handle.parent.gate if handle.parent else None
        holds_slot = False
        run.started = True
        try:
            if run.stop is not None:  # stopped before its first step
                raise asyncio.CancelledError
            clock = host.services.clock
            async with clock.deadline(None if run.deadline is None else run.deadline - clock.monotonic()):
                if gate is not None:
                    await self.queue_for(handle, gate)
                    holds_slot = True
                running = host.tenancy.running_gate(host.tenant) if host.tenancy is not None else None
                if running is not None:  # the tenant's running-handles quota: one of its slots
                    run.slot = RunningSlot(running, functools.partial(_record_queued, host.journal, handle.id))
                    await run.slot.hold()
                result = await host.turns.drive(handle, run)
                run.settling = True
        except TimeoutError:
            run.settling = True
            result = handle.result(
                Status.INCOMPLETE, text=_last_text(handle, "stopped at max_wall_time"), limit=Limit.MAX_WALL_TIME
            )
            await self._stop_descendants(run, (Status.INCOMPLETE, Limit.MAX_WALL_TIME))
        except Detached as stopped:
            self._runs.pop(handle.id, None)
            if isinstance(stopped, StoreUnavailable):
                # Cut by a read (its journal writes close the copy themselves): a copy whose run
                # stopped unrecorded is not trusted again; it is read again from the store once
                # that is back (service._back), and its runs go on from the journal.
                host.journal.closed = True
            return handle.result(Status.UNSPECIFIED)
        except asyncio.CancelledError:
            run.settling = True
            if run.shutdown:
                # The process is stopping: the run stays RUNNING in the store and goes on
                # from its journal at the next start.
                self._runs.pop(handle.id, None)
                raise
            status, limit = run.stop or (Status.INTERRUPTED, Limit.NONE)
            await self._stop_descendants(run, (status, limit))
            result = handle.result(status, text=_last_text(handle, status.name.lower()), limit=limit)
        except ProviderError as exc:
            run.settling = True
            await self._stop_descendants(run, (Status.INTERRUPTED, Limit.NONE))
            result = handle.result(Status.ERROR, text=f"model call failed: {exc}", is_error=True, failure=exc.failure)
        except Exception:
            run.settling = True
            # A bug of ours must not leave the handle RUNNING forever: settle it loudly.
            log.exception("run of %s/%s failed", host.key, handle.id)
            await self._stop_descendants(run, (Status.INTERRUPTED, Limit.NONE))
            result = handle.result(
                Status.ERROR,
                text="internal error in the runtime; see the server log",
                is_error=True,
                failure=Failure(FailureReason.RUNTIME, detail="see the server log"),
            )
        finally:
            if holds_slot and gate is not None:
                gate.release()
            if run.slot is not None:
                run.slot.close()
        await self._settle(handle, run, result)
        return result

    async def _stop_descendants(self, run: Run, stop: tuple[Status, Limit]) -> None:
        """A run that stops stops its children's runs, and withdraws what its children left
        suspended (its task call will have no result to wait for)."""
        for child in run.children:
            # The run is settling already: a second cancellation (Close racing Interrupt) must
            # not stop it from settling, or the handle would stay RUNNING for good.
            with contextlib.suppress(asyncio.CancelledError):
                await self.stop_run(child, stop)
        for child in run.children:
            if child.state is HandleState.SUSPENDED:
                await self.withdraw(child, stop, continue_parent=False)

    async def _settle(self, handle: Handle, run: Run, result: TaskResult) -> None:
        self._runs.pop(handle.id, None)
        if result.status is Status.CLOSED or handle.state is HandleState.CLOSED:
            state = HandleState.CLOSED
        else:
            state = HandleState.SUSPENDED if result.status is Status.PENDING else HandleState.IDLE
        settled = Settled(handle.id, result, state)
        transcript = handle.transcript
        if result.status is Status.INTERRUPTED:
            # The run is rolled back: its drained messages go back to the inbox, its
            # transcript entries are dropped; what it spent stays counted.
            settled = Settled(handle.id, result, state, run.transcript_mark, tuple(run.drained))
            transcript = transcript[: run.transcript_mark]
        steps: list[Step] = [settled]
        if result.status is not Status.PENDING:
            steps.extend(dangling_answers(handle, transcript, f"not run: the run stopped ({result.status.name})"))
        await self.host.journal.record(*steps)
        if result.pending is not None and result.pending.path == handle.path:
            self.host.timers.arm_lapse(result.pending)
        if not run.quiet:
            run.next = await self.continue_waiting_parent(handle)


def dangling_answers(handle: Handle, transcript: list[Message], reason: str) -> list[Step]:
    """Keeps the transcript well formed: every tool call made gets a tool message. A call
    cut off while its request was out may have taken effect: the model is told so, lest
    it make the call again under a new key."""
    if not transcript or not transcript[-1].tool_calls:
        return []
    answers = []
    for call in transcript[-1].tool_calls:
        result = handle.tool_results.get(call.id)
        if result is not None:
            content, is_error = result.output, result.is_error
        elif call.id in handle.started:
            content, is_error = "interrupted while running: it may or may not have taken effect", True
        else:
            content, is_error = reason, True
        answers.append(Message(role="tool", content=content, tool_call_id=call.id, is_error=is_error))
    return [MessagesAppended(handle.id, tuple(answers))]


def _last_text(handle: Handle, fallback: str) -> str:
    for message in reversed(handle.transcript):
        if message.role == "assistant" and message.content:
            return message.content
    return fallback
