"""One tree of handles and the verbs a host drives it with. Every change is a journal step
(journal.py); runs in flight are the only state kept in memory alone."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref

from . import budget as budgets
from .errors import (
    Detached,
    DomainError,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    shown,
)
from .events import Event, EventLog
from .gate import FifoGate
from .handle import Handle, Run
from .journal import (
    Answered,
    BudgetSet,
    CallFinished,
    Closed,
    InDoubt,
    Journal,
    MessagesAppended,
    Posted,
    Queued,
    RunStarted,
    Settled,
    Spawned,
    Step,
    Ticked,
    Tree,
    events_of,
)
from .model import (
    AgentSpec,
    Answer,
    Budget,
    Failure,
    FailureReason,
    HandleSnapshot,
    HandleState,
    InboxItem,
    Limit,
    Message,
    PendingRequest,
    Status,
    TaskResult,
    Trust,
)
from .ports import ProviderError, Services, Store, StoredRuntime
from .prompts import wake_message
from .quotas import QuotaExceeded, RunningSlot, Tenancy
from .suspension import read_answer
from .turns import TurnLoop
from .validation import check_budget, check_text_size

log = logging.getLogger(__name__)

LAPSE_RETRY_SECONDS = 1.0  # an expired Request the tenant's running-handles quota holds back lapses this much later


async def _stored_events(store: Store, key: str, after_seq: int) -> list[Event]:
    """A runtime's events after a seq, derived from its stored journal (Watch's history)."""
    entries = await store.entries_after_event(key, after_seq)
    return [event for entry in entries for event in events_of(entry) if event.seq > after_seq]


async def _record_queued(journal: Journal, handle_id: str, queued: bool) -> None:
    await journal.record(Queued(handle_id, queued))


class Runtime:
    def __init__(self, runtime_id: str, agents: tuple[AgentSpec, ...], services: Services, key: str = "") -> None:
        self.id = runtime_id  # as its tenant knows it
        self.key = key or runtime_id  # as the store knows it: unique over every tenant (service.runtime_key)
        self.tenant = self.key.rpartition(":")[0] or "default"
        self.tenancy: Tenancy | None = None  # set by the service: the tenant's quotas
        self.services = services
        self.tree = Tree(self.key, agents)
        # Nothing the runtime holds refers back to it (the history reader is no bound method,
        # the turn loop holds a weak proxy): a runtime that leaves the cache is freed at once,
        # not at the cyclic collector's next full pass (bench/store.py's RSS figures).
        history = functools.partial(_stored_events, services.store, self.key)
        self.events = EventLog(self.key, history, buffer=services.watch_buffer, observers=services.observers)
        self.journal = Journal(self.tree, services.store, self.events)
        # Resumes answered by this process: request id -> the run the answer continued.
        self.resumed: dict[str, Run] = {}
        self._model_gate: FifoGate | None = None
        self._heartbeats: dict[str, asyncio.TimerHandle] = {}
        self._lapses: dict[str, asyncio.TimerHandle] = {}  # request id -> its expiry
        self._loop = TurnLoop(weakref.proxy(self))
        self.draining = False  # set at shutdown: runs stop at their next journal point

    @classmethod
    def restore(cls, runtime_id: str, stored: StoredRuntime, services: Services, key: str = "") -> Runtime:
        """Rebuilds a runtime from its journal, exactly as it was acknowledged."""
        runtime = cls(runtime_id, stored.agents, services, key)
        runtime.journal = Journal.restore(runtime.tree, services.store, runtime.events, stored.entries)
        return runtime

    @property
    def handles(self) -> dict[str, Handle]:
        return self.tree.handles

    @property
    def agents(self) -> dict[str, AgentSpec]:
        return self.tree.agents

    @property
    def busy(self) -> bool:
        """True while a run is in flight, a heartbeat is armed, a live Request has an expiry
        to keep, or someone watches (the runtime must stay in memory)."""
        return (
            self.events.watched
            or bool(self._heartbeats)
            or any(h.run is not None for h in self.handles.values())
            or self.tree.expiring
        )

    @property
    def inbox_capacity(self) -> int:
        own = self.tree.options.inbox_capacity
        return min(own, self.services.inbox_capacity) if own else self.services.inbox_capacity

    @property
    def model_gate(self) -> FifoGate | None:
        """The runtime's own bound on model calls at once, if its options set one."""
        limit = self.tree.options.max_concurrent_model_calls
        if limit and self._model_gate is None:
            self._model_gate = FifoGate(limit)
        return self._model_gate

    async def queue_for(self, handle: Handle, gate: FifoGate) -> None:
        """Takes a slot of the gate; a handle that has to wait shows QUEUED meanwhile."""
        if not gate.would_wait:
            await gate.acquire()
            return
        await self.journal.record(Queued(handle.id, True))
        await gate.acquire()
        await self.journal.record(Queued(handle.id, False))

    async def recover(self) -> int:
        """Continues every handle that was RUNNING when the process died, from its journal.

        A call started but never recorded is in doubt: its tool's on_interrupted policy
        decides (RETRY: it runs again with the same idempotency key; ASK: the host decides).
        Children are continued before their parents, so a parent re-entering its tool
        phase reattaches to the child's run instead of reading a stale result."""
        running = [h for h in self.handles.values() if h.state.in_flight]
        for handle in sorted(running, key=lambda h: h.seq, reverse=True):
            asking = []
            for call_id in sorted(handle.started - set(handle.tool_results)):
                call = self._loop.find_call(handle, call_id)
                spec = handle.agent.tool(call.name) if call else None
                if spec is not None and spec.asks_when_in_doubt:
                    asking.append(call_id)
            if asking:
                await self.journal.record(InDoubt(handle.id, tuple(asking)))
            await self.continue_run(handle)
        return len(running)

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
            raise FailedPrecondition(f"parent {parent.id!r} is closed; spawn under an open handle", reason="HANDLE_CLOSED")
        agent = self.agent(agent_name)
        if budget_override is not None:
            violations = check_budget(budget_override, "budget")
            if violations:
                raise InvalidArgument(violations)
        return await self.spawn_child(parent, agent, budget_override, key=None)

    async def spawn_child(
        self, parent: Handle | None, agent: AgentSpec, budget_override: Budget | None, key: str | None, delegated: bool = True
    ) -> Handle:
        if parent is not None:
            budgets.check_spawn(parent)
        if len(self.handles) >= self.services.limits.max_handles:
            raise ResourceExhausted(
                f"runtime {self.id!r} has {len(self.handles)} handles, the server's limit (AGENTRUNTIME_MAX_HANDLES)",
                reason=Limit.MAX_CHILDREN.wire_name,
                limit=Limit.MAX_CHILDREN,
            )
        if self.tenancy is not None:
            await self.tenancy.check_store(self.tenant)
            self.tenancy.count_spawn(self.tenant)  # last: a spawn refused for another reason is not counted
        counters = parent.spawned_per_agent if parent else self.tree.top_level_per_agent
        number = counters.get(agent.name, 0) + 1
        handle_id = f"{parent.id if parent else 'root'}/{agent.name}.{number}"
        own = agent.budget.overridden_by(budget_override) if budget_override else agent.budget
        budget = budgets.carve(own, parent, delegated)
        await self.journal.record(Spawned(handle_id, parent.id if parent else "", agent.name, budget, key or "", number))
        handle = self.handles[handle_id]
        self.arm_heartbeat(handle)
        return handle

    async def post(
        self, handle_id: str, text: str, channel: str, sender: str, trust: Trust = Trust.HOST, coalesce_key: str = ""
    ) -> int:
        handle = self.handle(handle_id)
        if handle.state is HandleState.CLOSED:
            raise FailedPrecondition(f"handle {handle_id!r} is closed; it takes no more messages", reason="HANDLE_CLOSED")
        if not text:
            raise InvalidArgument([FieldViolation("text", "post a non-empty message")])
        check_text_size(text, "text", self.services.limits)
        check_text_size(coalesce_key, "coalesce_key", self.services.limits, limit=256)
        merges = bool(coalesce_key) and any(item.coalesce_key == coalesce_key for item in handle.inbox)
        if len(handle.inbox) >= self.inbox_capacity and not merges:
            raise ResourceExhausted(
                f"the inbox of {handle_id!r} is full ({self.inbox_capacity} messages); Wake it to drain the inbox",
                reason="INBOX_FULL",
            )
        held = sum(len(item.text.encode()) for item in handle.inbox if not (merges and item.coalesce_key == coalesce_key))
        if held + len(text.encode()) > self.services.limits.max_inbox_bytes:
            raise ResourceExhausted(
                f"the inbox of {handle_id!r} holds {held} bytes; with this message it would pass its limit of "
                f"{self.services.limits.max_inbox_bytes} bytes; Wake it to drain the inbox",
                reason="INBOX_FULL",
            )
        check_text_size(channel, "channel", self.services.limits, limit=256)
        check_text_size(sender, "sender", self.services.limits, limit=256)
        if self.tenancy is not None:
            await self.tenancy.check_store(self.tenant)
        item = InboxItem(text=text, channel=channel, sender=sender or "host", trust=trust, coalesce_key=coalesce_key)
        await self.journal.record(Posted(handle.id, item))
        return len(handle.inbox)

    async def wake(self, handle_id: str, prompt: str) -> bool:
        check_text_size(prompt, "prompt", self.services.limits)
        handle = self.handle(handle_id)
        self._check_wakeable(handle)
        if self.tenancy is not None:
            self.tenancy.check_running(self.tenant)
        if not prompt and not handle.inbox:
            raise InvalidArgument([FieldViolation("prompt", "the prompt is empty and the inbox is empty: nothing to run on")])
        if self.tenancy is not None:
            await self.tenancy.check_store(self.tenant)
        await self.start_run(handle, prompt)
        return True

    async def wait(self, handle_id: str, timeout: float | None) -> TaskResult:
        handle = self.handle(handle_id)
        run = handle.run
        if run is not None and run.task is not None:
            try:
                result = await asyncio.wait_for(asyncio.shield(run.task), timeout)
            except TimeoutError:
                return handle.result(Status.TIMEOUT, text=f"{handle_id!r} is still running")
            if result.status is Status.UNSPECIFIED:
                raise Unavailable(f"the server is shutting down; Wait again on {handle_id!r} at its replacement")
            # The run this Wait waited for settled: its result, even if a Close came right after.
            return handle.with_current_figures(result)
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
        if handle.state is HandleState.SUSPENDED:
            await self._withdraw(handle, (Status.INTERRUPTED, Limit.NONE), continue_parent=True)
            return True
        return await self.stop_run(handle, (Status.INTERRUPTED, Limit.NONE))

    async def _withdraw(self, top: Handle, stop: tuple[Status, Limit], continue_parent: bool) -> None:
        """Stops a subtree that is not running as a whole (`top` suspended, or a stopped run's
        child): what runs in it stops, leaf first (a child continued by a Resume under a
        suspended parent), then every suspension in it is cancelled, leaf first. Only `top`'s
        settling may continue its parent, and only with `continue_parent`."""
        for node in top.subtree_leaf_first():
            if node.run is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.stop_run(node, stop, quiet=True)
        for node in top.subtree_leaf_first():
            if node.state is HandleState.SUSPENDED:
                with contextlib.suppress(asyncio.CancelledError):  # a half-withdrawn subtree would keep live Requests
                    await self._cancel_suspension(node, stop, continue_parent=continue_parent and node is top)

    async def close(self, handle_id: str, force: bool, grace: float | None = None) -> list[str]:
        """Closes a handle's subtree leaf first; `root` closes every top-level handle's. With a
        grace, running handles get that long to settle on their own before they are interrupted."""
        handle = None if handle_id == "root" else self.handle(handle_id)
        subtree = self._close_scope(handle)
        busy = [node for node in subtree if node.run is not None]
        if busy and not force and grace is None:
            raise FailedPrecondition(
                f"handles {[node.id for node in busy]} are running; Interrupt them first, or Close with force or a grace",
                reason="HANDLE_RUNNING",
            )
        if busy and grace:
            tasks = [node.run.task for node in busy if node.run is not None and node.run.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=grace)
        closed: list[str] = []
        # Listed again after the grace, and until nothing is left open: a handle running
        # meanwhile may have spawned children (a task call), which close with it.
        while True:
            left = [node for node in self._close_scope(handle) if node.state is not HandleState.CLOSED]
            if not left:
                return closed
            for node in left:
                if node.state is HandleState.CLOSED:
                    continue
                if node.state is HandleState.SUSPENDED:
                    await self._cancel_suspension(
                        node, (Status.CLOSED, Limit.NONE), continue_parent=handle is not None and node is handle
                    )
                # A node below the closed handle settles without continuing its parent, which closes too.
                await self.stop_run(node, (Status.CLOSED, Limit.NONE), quiet=node is not handle)
                await self.journal.record(Closed(node.id))
                timer = self._heartbeats.pop(node.id, None)
                if timer is not None:
                    timer.cancel()
                closed.append(node.id)

    def _close_scope(self, handle: Handle | None) -> list[Handle]:
        """The handles a Close of `handle` (None: the whole runtime) closes, leaf first."""
        if handle is not None:
            return handle.subtree_leaf_first()
        tops = [node for node in self.handles.values() if node.parent is None]
        return [node for top in tops for node in top.subtree_leaf_first()]

    async def _cancel_suspension(self, handle: Handle, stop: tuple[Status, Limit], continue_parent: bool) -> None:
        """Interrupt/Close of a SUSPENDED handle (or of a run it works for): its Request is
        withdrawn, Wait tells why."""
        status, limit = stop
        kind = handle.pending.kind if handle.pending else "?"
        result = handle.result(status, text=f"the pending {kind} request was cancelled", limit=limit)
        state = HandleState.CLOSED if status is Status.CLOSED else HandleState.IDLE
        reason = f"not run: the pending {kind} request was cancelled ({status.name})"
        await self.journal.record(*self._dangling_answers(handle, handle.transcript, reason), Settled(handle.id, result, state))
        if continue_parent:
            await self._continue_waiting_parent(handle)

    async def resume(self, answer: Answer, lapsed: bool = False) -> TaskResult:
        """`lapsed`: the Request expired (an error result, however full the tenant's store is)."""
        leaf = self.tree.requests.get(answer.id)
        if leaf is None or leaf.pending is None:
            return await self._retried_resume(answer)
        outcome = read_answer(leaf.pending, answer, self.services.limits)  # refuses a bad answer before any change
        if self.tenancy is not None and not outcome.declined:
            self.tenancy.check_running(self.tenant)  # a Resume starts a run, as a Wake does
            if not lapsed:
                await self.tenancy.check_store(self.tenant)
        if outcome.declined:
            return await self._stop_at_budget(leaf, answer)
        calls = {call.id: call for call, _ in leaf.pending.calls}
        extension = []
        if outcome.extend:
            budget = budgets.extended(leaf, outcome.extend)
            budgets.check_raised(leaf, budget, str(leaf.pending.data.get("field", "")))
            extension = [BudgetSet(leaf.id, budget)]
        await self.journal.record(
            Answered(answer.id, answer, leaf.id, tuple(outcome.approved), tuple(outcome.rerun), tuple(outcome.for_tool)),
            *extension,
            *(CallFinished(leaf.id, calls[call_id], result) for call_id, result in outcome.results),
        )
        run = await self.continue_run(leaf)
        self.resumed[answer.id] = run
        try:
            return await self._follow(run)
        finally:
            # A retry after the chain settled reads the settled result (_retried_resume).
            self.resumed.pop(answer.id, None)

    async def _stop_at_budget(self, leaf: Handle, answer: Answer) -> TaskResult:
        """The host declined to extend a budget: the run stops there, as a STOP budget would."""
        assert leaf.pending is not None
        limit = next((limit for limit in Limit if limit.wire_name == leaf.pending.data.get("limit")), Limit.MAX_TURNS)
        result = leaf.result(Status.INCOMPLETE, text=f"stopped at {limit.wire_name}", limit=limit)
        await self.journal.record(
            Answered(answer.id, answer, leaf.id),
            Settled(leaf.id, result, HandleState.IDLE),
            *self._dangling_answers(leaf, leaf.transcript, f"not run: the run stopped at {limit.wire_name}"),
        )
        run = await self._continue_waiting_parent(leaf)
        if run is None:
            return self.settled_result(leaf)
        self.resumed[answer.id] = run
        return await self._follow(run)

    async def _retried_resume(self, answer: Answer) -> TaskResult:
        """A retried Resume: the same answer gets the same result and runs nothing again."""
        earlier = self.tree.answered.get(answer.id)
        if earlier is None:
            raise FailedPrecondition(
                f"no live request has id {shown(answer.id)} in runtime {self.id!r}; "
                "Wait on the root handle to see its pending request",
                reason="NO_SUCH_REQUEST",
            )
        if earlier[0] != answer:
            raise FailedPrecondition(
                f"request {shown(answer.id)} was already answered with a different answer; it cannot be answered twice",
                reason="ALREADY_ANSWERED",
            )
        run = self.resumed.get(answer.id)
        if run is not None:
            return await self._follow(run)
        # The topmost handle the first Resume's chain of continued runs reached (the journal
        # tells, so also after a restart); while it still runs, the chain goes on from it.
        topmost = self.handle(self.tree.resumed_top.get(answer.id, earlier[1]))
        if topmost.run is not None and topmost.run.task is not None:
            return await self._follow(topmost.run)
        return self.settled_result(topmost)

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

    def transcript(self, handle_id: str) -> list[Message]:
        return self.handle(handle_id).transcript_with_summaries()

    def inspect(self, handle_id: str) -> HandleSnapshot:
        return self.handle(handle_id).snapshot()

    def list_handles(self) -> list[HandleSnapshot]:
        return [handle.snapshot() for handle in self.handles.values()]

    # ---- runs ----------------------------------------------------------------------------

    def _check_wakeable(self, handle: Handle) -> None:
        if handle.state is HandleState.CLOSED:
            raise FailedPrecondition(f"handle {handle.id!r} is closed; spawn a new one", reason="HANDLE_CLOSED")
        closed = self._closed_ancestor(handle)
        if closed is not None:
            raise FailedPrecondition(
                f"handle {handle.id!r} is in the closed subtree of {closed.id!r}; spawn a new one", reason="HANDLE_CLOSED"
            )
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

    @staticmethod
    def _closed_ancestor(handle: Handle) -> Handle | None:
        """A closed handle's subtree runs no more (a store written before Close listed the
        subtree again after its grace may hold an open child under a closed parent)."""
        return next((node for node in handle.lineage() if node.state is HandleState.CLOSED), None)

    async def start_run(self, handle: Handle, prompt: str, parent_run: Run | None = None) -> Run:
        """A new run on the prompt and the drained inbox, journaled before it is acknowledged."""
        run = self._begin(handle, list(handle.inbox), parent_run)
        await self.journal.record(RunStarted(handle.id, wake_message(prompt, run.drained), len(run.drained)))
        run.task = asyncio.get_running_loop().create_task(self._execute(handle, run))
        return run

    async def continue_run(self, handle: Handle) -> Run:
        """Re-enters a handle's turn from its transcript and journal (after a Resume or a restart)."""
        run = self._begin(handle, [], None)
        await self.journal.record(RunStarted(handle.id, None))
        run.task = asyncio.get_running_loop().create_task(self._execute(handle, run))
        return run

    def _begin(self, handle: Handle, drained: list[InboxItem], parent_run: Run | None) -> Run:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + handle.budget.max_wall_time if handle.budget.max_wall_time else None
        if parent_run is not None and parent_run.deadline is not None:
            deadline = parent_run.deadline if deadline is None else min(deadline, parent_run.deadline)
        # An interrupted run rolls back to here: for a new run, to just before its prompt.
        run = Run(drained=drained, transcript_mark=len(handle.transcript), deadline=deadline)
        handle.run = run
        return run

    async def _continue_waiting_parent(self, child: Handle) -> Run | None:
        """A child whose suspended parent waits on it has settled: the parent goes on."""
        parent = child.parent
        if parent is None or parent.state is not HandleState.SUSPENDED or not child.child_key:
            return None
        return await self.continue_run(parent)

    async def tokens_left(self) -> int | None:
        return None if self.tenancy is None else await self.tenancy.tokens_left(self.tenant)

    async def spend(self, tokens: int) -> None:
        if self.tenancy is not None and tokens:
            await self.tenancy.spend(self.tenant, tokens)

    def stop_timers(self) -> None:
        """No timer acts again and no run starts (a deleted runtime)."""
        self.release_timers()
        self.draining = True

    async def detach_runs(self) -> None:
        """Process shutdown: cancel every run without settling it (it resumes at the next start)."""
        runs = [handle.run for handle in self.handles.values() if handle.run is not None]
        for run in runs:
            run.shutdown = True
            if run.task is not None:
                run.task.cancel()
        await asyncio.gather(*(run.task for run in runs if run.task is not None), return_exceptions=True)

    async def stop_run(self, handle: Handle, stop: tuple[Status, Limit], quiet: bool = False) -> bool:
        """Cancels the handle's run, if any, and waits until it has settled. `quiet`: it is
        stopped with its ancestors, and its settling does not continue a suspended parent."""
        run = handle.run
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

    async def _execute(self, handle: Handle, run: Run) -> TaskResult:
        gate = handle.parent.gate if handle.parent else None
        holds_slot = False
        run.started = True
        try:
            if run.stop is not None:  # stopped before its first step
                raise asyncio.CancelledError
            async with asyncio.timeout_at(run.deadline):
                if gate is not None:
                    await self.queue_for(handle, gate)
                    holds_slot = True
                running = self.tenancy.running_gate(self.tenant) if self.tenancy is not None else None
                if running is not None:  # the tenant's running-handles quota: one of its slots
                    run.slot = RunningSlot(running, functools.partial(_record_queued, self.journal, handle.id))
                    await run.slot.hold()
                result = await self._loop.drive(handle, run)
                run.settling = True
        except TimeoutError:
            run.settling = True
            result = handle.result(
                Status.INCOMPLETE, text=self._last_text(handle, "stopped at max_wall_time"), limit=Limit.MAX_WALL_TIME
            )
            await self._stop_descendants(run, (Status.INCOMPLETE, Limit.MAX_WALL_TIME))
        except Detached:
            handle.run = None
            return handle.result(Status.UNSPECIFIED)
        except asyncio.CancelledError:
            run.settling = True
            if run.shutdown:
                # The process is stopping: the run stays RUNNING in the store and goes on
                # from its journal at the next start.
                handle.run = None
                raise
            status, limit = run.stop or (Status.INTERRUPTED, Limit.NONE)
            await self._stop_descendants(run, (status, limit))
            result = handle.result(status, text=self._last_text(handle, status.name.lower()), limit=limit)
        except ProviderError as exc:
            run.settling = True
            await self._stop_descendants(run, (Status.INTERRUPTED, Limit.NONE))
            result = handle.result(Status.ERROR, text=f"model call failed: {exc}", is_error=True, failure=exc.failure)
        except Exception:
            run.settling = True
            # A bug of ours must not leave the handle RUNNING forever: settle it loudly.
            log.exception("run of %s/%s failed", self.key, handle.id)
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
                await self._withdraw(child, stop, continue_parent=False)

    async def _settle(self, handle: Handle, run: Run, result: TaskResult) -> None:
        handle.run = None
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
            steps.extend(self._dangling_answers(handle, transcript, f"not run: the run stopped ({result.status.name})"))
        await self.journal.record(*steps)
        if result.pending is not None and result.pending.path == handle.path:
            self.arm_lapse(result.pending)
        if not run.quiet:
            run.next = await self._continue_waiting_parent(handle)

    def arm_timers(self) -> None:
        """After a restore: every live Request that expires lapses on time, every heartbeat beats."""
        for request in [handle.pending for handle in self.tree.requests.values()]:
            if request is not None:
                self.arm_lapse(request)
        for handle in self.handles.values():
            self.arm_heartbeat(handle)

    def arm_heartbeat(self, handle: Handle) -> None:
        """Schedules the handle's next tick. After downtime the periods missed come due at
        once, as one tick that counts them (no burst)."""
        beat = handle.agent.heartbeat
        if beat is None or handle.state is HandleState.CLOSED or self.draining:
            return
        now = time.time()
        due = (handle.last_tick or now) + beat.every
        loop = asyncio.get_running_loop()
        replaced = self._heartbeats.get(handle.id)
        if replaced is not None:  # one chain of ticks a handle, however often it is armed
            replaced.cancel()
        self._heartbeats[handle.id] = loop.call_later(max(due - now, 0.0), lambda: loop.create_task(self._beat(handle)))

    async def _beat(self, handle: Handle) -> None:
        self._heartbeats.pop(handle.id, None)
        beat = handle.agent.heartbeat
        if beat is None or handle.state is HandleState.CLOSED or self.draining:
            return
        now = time.time()
        missed = max(int((now - handle.last_tick) // beat.every), 1) if handle.last_tick else 1
        await self.journal.record(Ticked(handle.id, now, missed))
        self.arm_heartbeat(handle)
        if handle.state is HandleState.IDLE and handle.run is None and self._closed_ancestor(handle) is None:
            if self.tenancy is not None:
                try:
                    self.tenancy.check_running(self.tenant)
                except QuotaExceeded:
                    return  # a beat starts a run as a Wake does; the tick waits in the inbox for the next one
            await self.start_run(handle, "")

    def arm_lapse(self, request: PendingRequest, at_least: float = 0.0) -> None:
        if request.expires_at is None or self.draining:
            return
        loop = asyncio.get_running_loop()
        delay = max(request.expires_at - time.time(), at_least)
        replaced = self._lapses.get(request.id)
        if replaced is not None:
            replaced.cancel()
        self._lapses[request.id] = loop.call_later(delay, lambda: loop.create_task(self._lapse(request.id)))

    def release_timers(self) -> None:
        """The runtime leaves memory (evicted, deleted, shut down): no timer of this copy may
        act again; a reload arms its own (arm_timers)."""
        for timer in [*self._heartbeats.values(), *self._lapses.values()]:
            timer.cancel()
        self._heartbeats.clear()
        self._lapses.clear()

    async def _lapse(self, request_id: str) -> None:
        """An expired Request that nobody answered: its call becomes an error result."""
        self._lapses.pop(request_id, None)
        if request_id in self.tree.requests and not self.draining:
            try:
                await self.resume(Answer(id=request_id, ok=False, reason="the request expired"), lapsed=True)
            except QuotaExceeded:
                # The run goes on as after a Resume, so it waits for room in the tenant's quota.
                leaf = self.tree.requests.get(request_id)
                if leaf is not None and leaf.pending is not None:
                    self.arm_lapse(leaf.pending, at_least=LAPSE_RETRY_SECONDS)
            except DomainError:
                pass

    @staticmethod
    def _dangling_answers(handle: Handle, transcript: list[Message], reason: str) -> list[Step]:
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

    @staticmethod
    def _last_text(handle: Handle, fallback: str) -> str:
        for message in reversed(handle.transcript):
            if message.role == "assistant" and message.content:
                return message.content
        return fallback
