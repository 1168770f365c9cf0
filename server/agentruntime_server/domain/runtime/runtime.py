"""One tree of handles and the verbs a host drives it with. Every change is a journal step
(journal.py); what runs in memory alone is kept apart from the replayed tree: the runs in
flight (runs.py) and the timers (timers.py), both only once the runtime is taken over.

A runtime is loaded (Runtime.restore) without a side effect: reading it arms nothing and
runs nothing. `take_over` is the one step by which this process starts running it."""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..clock import wait_at_most
from ..definitions.validation import check_budget, check_text_size
from ..errors import (
    FailedPrecondition,
    Fenced,
    FieldViolation,
    InvalidArgument,
    NotFound,
    RequestIdReused,
    ResourceExhausted,
    Unavailable,
)
from ..fifo_gate import FifoGate
from ..journal import Closed, Journal, Posted, Replied, Spawned, Tree, events_of
from ..journal.handle import Handle
from ..ports import Services, Store, StoredRuntime
from ..runs import budgets
from ..runs.driver import RunDriver, closed_ancestor
from ..runs.turn_loop import TurnLoop
from ..tenancy.quotas import Tenancy
from ..vocabulary import (
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
    Trust,
)
from ..watching.event_log import Event, EventLog
from .recovery import continue_held, continue_interrupted, held_in_tree
from .request_ids import OneAtATime, RequestKey
from .resumes import Resumes
from .timers import Timers

_Answer = TypeVar("_Answer")


async def _stored_events(store: Store, key: str, after_seq: int, limit: int) -> list[Event]:
    """A runtime's events after a seq, derived from the next `limit` entries of its stored
    journal (a page of Watch's history)."""
    entries = await store.entries_after_event(key, after_seq, limit)
    return [event for entry in entries for event in events_of(entry) if event.seq > after_seq]


class Runtime:
    def __init__(self, runtime_id: str, agents: tuple[AgentSpec, ...], services: Services, key: str = "") -> None:
        self.id = runtime_id  # as its tenant knows it
        self.key = key or runtime_id  # as the store knows it: unique over every tenant (service.runtime_key)
        self.tenant = self.key.rpartition(":")[0] or "default"
        self.tenancy: Tenancy | None = None  # set by the service: the tenant's quotas
        self.services = services
        self.tree = Tree(self.key, agents, services.limits.request_ids_kept)
        # Nothing the runtime holds refers back to it (the history reader is no bound method,
        # its parts hold a weak proxy): a runtime that leaves the cache is freed at once,
        # not at the cyclic collector's next full pass (bench/store.py's RSS figures).
        history = functools.partial(_stored_events, services.store, self.key)
        self.events = EventLog(
            self.key, history, buffer=services.watch_buffer, observers=services.observers, clock=services.clock
        )
        self.journal = Journal(self.tree, services.store, self.events, clock=services.clock)
        self.requests_served = OneAtATime()  # calls with request ids, one at a time per id
        self._model_gate: FifoGate | None = None
        self._host = weakref.proxy(self)
        self.runs = RunDriver(self._host)
        self.timers = Timers(self._host)
        self.resumes = Resumes(self._host)
        self.draining = False  # set at shutdown: runs stop at their next journal point
        self.taken_over = False  # set by take_over: this process runs it (timers armed, runs continued)
        self._taking_over: asyncio.Task[int] | None = None
        self.replay_driver: asyncio.Task[None] | None = None  # a replay's (replays.driving)

    @classmethod
    def restore(cls, runtime_id: str, stored: StoredRuntime, services: Services, key: str = "") -> Runtime:
        """Rebuilds a runtime from its journal, exactly as it was acknowledged. Nothing more:
        no timer is armed and no run starts until it is taken over."""
        runtime = cls(runtime_id, stored.agents, services, key)
        runtime.journal = Journal.restore(runtime.tree, services.store, runtime.events, stored.entries, services.clock)
        return runtime

    async def take_over(self) -> int:
        """This process runs the runtime from now on: every heartbeat is armed, every live
        Request that expires lapses on time, and the handles that were RUNNING when its last
        process stopped go on from their journal (recovery.py). Once per copy: a caller that
        comes while the first one's take-over is under way waits for it. Returns how many
        handles went on (0 to every caller but the first)."""
        if not self.taken_over:
            self.taken_over = True
            if not self.tree.running:
                # Nothing to continue: the timers are armed in this step, with no await between
                # the load and the call that takes it over (a retention pass that came between
                # would find the copy idle, delete it, and refuse the call as changed under it).
                if not self.draining:
                    self.timers.arm_all()
                return 0
            taking_over = self._taking_over = asyncio.get_running_loop().create_task(self._take_over())
            # Its callers may all be gone (a cancelled call): the task goes on, its outcome is read.
            taking_over.add_done_callback(lambda done: done.cancelled() or done.exception())
            return await asyncio.shield(taking_over)
        if self._taking_over is not None:
            await asyncio.shield(self._taking_over)
        return 0

    async def _take_over(self) -> int:
        try:
            if self.draining:
                return 0
            self.timers.arm_all()
            return await continue_interrupted(self)
        finally:
            self._taking_over = None  # done: nothing of it is kept

    @functools.cached_property
    def turns(self) -> TurnLoop:
        """Built for the first run: a copy that is only read has none."""
        return TurnLoop(self._host)

    @property
    def handles(self) -> dict[str, Handle]:
        return self.tree.handles

    @property
    def agents(self) -> dict[str, AgentSpec]:
        return self.tree.agents

    @property
    def busy(self) -> bool:
        """True while a run is in flight, a heartbeat is armed, a live Request has an expiry
        to keep, or someone watches (the runtime must stay in memory). A copy that was only
        read keeps nothing: it may leave memory, the store has all of it."""
        return self.events.watched or self.runs.in_flight or (self.taken_over and (self.timers.beating or self.tree.expiring))

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

    async def tokens_left(self) -> int | None:
        return None if self.tenancy is None else await self.tenancy.tokens_left(self.tenant)

    async def cost_left(self) -> int | None:
        return None if self.tenancy is None else await self.tenancy.cost_left(self.tenant)

    async def spend(self, tokens: int, micros: int = 0) -> None:
        if self.tenancy is not None and (tokens or micros):
            await self.tenancy.spend(self.tenant, tokens, micros)

    def stop_timers(self) -> None:
        """No timer acts again and no run starts (a deleted runtime, a copy that lost its lease)."""
        self.timers.release()
        self.draining = True

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

    async def once(
        self,
        request: RequestKey | None,
        rpc: str,
        act: Callable[[], Awaitable[_Answer]],
        answer: Callable[[Replied], Awaitable[_Answer]],
    ) -> _Answer:
        """A host's call: acted on, or (its request id answered already) its first answer.
        `act` records the call's Replied with its effect."""
        if request is None:
            return await act()
        async with self.requests_served.turn(request.id):
            earlier = self.tree.replies.find(request.id, self.services.clock.time() - self.services.limits.request_id_ttl)
            if earlier is None:
                return await act()
            if not request.matches(rpc, earlier.rpc, earlier.digest):
                raise RequestIdReused(request.id, rpc)
            return await answer(earlier)

    async def spawn(
        self, parent_id: str, agent_name: str, budget_override: Budget | None, request: RequestKey | None = None
    ) -> Handle:
        async def spawned(replied: Replied) -> Handle:
            return self.handle(replied.handle_ids[0])

        return await self.once(request, "Spawn", lambda: self._spawn(parent_id, agent_name, budget_override, request), spawned)

    async def _spawn(self, parent_id: str, agent_name: str, budget_override: Budget | None, request: RequestKey | None) -> Handle:
        parent = None if parent_id == "root" else self.handle(parent_id)
        if parent is not None and parent.state is HandleState.CLOSED:
            raise FailedPrecondition(f"parent {parent.id!r} is closed; spawn under an open handle", reason="HANDLE_CLOSED")
        agent = self.agent(agent_name)
        if budget_override is not None:
            violations = check_budget(budget_override, "budget")
            if violations:
                raise InvalidArgument(violations)
        return await self.spawn_child(parent, agent, budget_override, key=None, request=request)

    async def spawn_child(
        self,
        parent: Handle | None,
        agent: AgentSpec,
        budget_override: Budget | None,
        key: str | None,
        delegated: bool = True,
        request: RequestKey | None = None,
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
        spawned = Spawned(handle_id, parent.id if parent else "", agent.name, budget, key or "", number)
        await self.journal.record(spawned, *([request.replied("Spawn", (handle_id,))] if request else []))
        handle = self.handles[handle_id]
        self.timers.arm_heartbeat(handle)
        return handle

    async def post(
        self,
        handle_id: str,
        text: str,
        channel: str,
        sender: str,
        trust: Trust = Trust.HOST,
        coalesce_key: str = "",
        request: RequestKey | None = None,
    ) -> int:
        async def posted(replied: Replied) -> int:
            return replied.number

        return await self.once(
            request, "Post", lambda: self._post(handle_id, text, channel, sender, trust, coalesce_key, request), posted
        )

    async def _post(
        self, handle_id: str, text: str, channel: str, sender: str, trust: Trust, coalesce_key: str, request: RequestKey | None
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
        size = len(handle.inbox) + (not merges)  # a message merged into a waiting one counts once
        await self.journal.record(Posted(handle.id, item), *([request.replied("Post", number=size)] if request else []))
        return size

    async def wake(self, handle_id: str, prompt: str, request: RequestKey | None = None) -> bool:
        async def woken(replied: Replied) -> bool:
            return bool(replied.number)

        return await self.once(request, "Wake", lambda: self._wake(handle_id, prompt, request), woken)

    async def _wake(self, handle_id: str, prompt: str, request: RequestKey | None) -> bool:
        check_text_size(prompt, "prompt", self.services.limits)
        handle = self.handle(handle_id)
        held = held_in_tree(handle)
        if held:
            return await self._release(handle, held, prompt, request)
        self._check_wakeable(handle)
        if self.tenancy is not None:
            self.tenancy.check_running(self.tenant)
        if not prompt and not handle.inbox:
            raise InvalidArgument([FieldViolation("prompt", "the prompt is empty and the inbox is empty: nothing to run on")])
        if self.tenancy is not None:
            await self.tenancy.check_store(self.tenant)
        await self.runs.start_run(handle, prompt, also=[request.replied("Wake", number=1)] if request else [])
        return True

    async def _release(self, woken: Handle, held: list[Handle], prompt: str, request: RequestKey | None) -> bool:
        """A Wake in a fork's tree with runs held at the cut: they go on from their journal, as
        after a restart (a call in doubt at the cut under its tool's policy), children first."""
        if prompt:
            raise InvalidArgument(
                [
                    FieldViolation(
                        "prompt",
                        f"{woken.id!r} is in a tree whose runs are held at the fork's cut ({held[0].id!r}): Wake it "
                        "with no prompt to let them go on (Post adds a message for its next run)",
                    )
                ]
            )
        if self.tenancy is not None:
            self.tenancy.check_running(self.tenant)
        for handle in held:
            await continue_held(self, handle)
        if request is not None:
            await self.journal.record(request.replied("Wake", number=1))
        return True

    async def wait(self, handle_id: str, timeout: float | None) -> TaskResult:
        """The result of the handle's run in flight, once it settles (TIMEOUT past `timeout`);
        with none (always so in a copy not taken over), its settled result as stored."""
        handle = self.handle(handle_id)
        if handle.state is HandleState.HELD:
            raise FailedPrecondition(
                f"handle {handle_id!r} is held at the fork's cut; Wake it (with no prompt) to let its run go on",
                reason="HANDLE_HELD",
            )
        run = self.runs.get(handle.id)
        if run is not None and run.task is not None:
            try:
                async with self.services.clock.deadline(timeout):
                    result = await asyncio.shield(run.task)
            except TimeoutError:
                return handle.result(Status.TIMEOUT, text=f"{handle_id!r} is still running")
            except asyncio.CancelledError:
                if not run.task.cancelled():
                    raise  # this Wait was cancelled (its deadline, its caller gone)
                # The run was cut without settling: this copy stopped (its lease lost, a write of
                # it not taken), and the runtime goes on from its journal where it is taken over.
                raise Fenced(self.id) from None
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

    async def interrupt(self, handle_id: str, request: RequestKey | None = None) -> bool:
        async def interrupted(replied: Replied) -> bool:
            return bool(replied.number)

        return await self.once(request, "Interrupt", lambda: self._interrupt(handle_id, request), interrupted)

    async def _interrupt(self, handle_id: str, request: RequestKey | None) -> bool:
        handle = self.handle(handle_id)
        if handle.state is HandleState.SUSPENDED:
            await self.runs.withdraw(handle, (Status.INTERRUPTED, Limit.NONE), continue_parent=True)
            stopped = True
        else:
            stopped = await self.runs.stop_run(handle, (Status.INTERRUPTED, Limit.NONE))
        if request is not None:
            # Its effect is the settling of the runs it stopped, recorded by them: the answer
            # comes after, so a stored answer always has its effect stored before it.
            await self.journal.record(request.replied("Interrupt", number=int(stopped)))
        return stopped

    async def close(
        self, handle_id: str, force: bool, grace: float | None = None, request: RequestKey | None = None
    ) -> list[str]:
        """Closes a handle's subtree leaf first; `root` closes every top-level handle's. With a
        grace, running handles get that long to settle on their own before they are interrupted."""

        async def closed(replied: Replied) -> list[str]:
            return list(replied.handle_ids)

        return await self.once(request, "Close", lambda: self._close(handle_id, force, grace, request), closed)

    async def _close(self, handle_id: str, force: bool, grace: float | None, request: RequestKey | None) -> list[str]:
        handle = None if handle_id == "root" else self.handle(handle_id)
        running = {node.id: run for node in self._close_scope(handle) if (run := self.runs.get(node.id)) is not None}
        if running and not force and grace is None:
            raise FailedPrecondition(
                f"handles {list(running)} are running; Interrupt them first, or Close with force or a grace",
                reason="HANDLE_RUNNING",
            )
        if running and grace:
            await wait_at_most(self.services.clock, [run.task for run in running.values() if run.task is not None], grace)
        closed: list[str] = []
        # Listed again after the grace, and until nothing is left open: a handle running
        # meanwhile may have spawned children (a task call), which close with it.
        while True:
            left = [node for node in self._close_scope(handle) if node.state is not HandleState.CLOSED]
            if not left:
                if request is not None:  # after the Closed steps, as Interrupt's answer is
                    await self.journal.record(request.replied("Close", tuple(closed)))
                return closed
            for node in left:
                if node.state is HandleState.CLOSED:
                    continue
                if node.state is HandleState.SUSPENDED:
                    await self.runs.cancel_suspension(
                        node, (Status.CLOSED, Limit.NONE), continue_parent=handle is not None and node is handle
                    )
                # A node below the closed handle settles without continuing its parent, which closes too.
                await self.runs.stop_run(node, (Status.CLOSED, Limit.NONE), quiet=node is not handle)
                await self.journal.record(Closed(node.id))
                self.timers.disarm_heartbeat(node.id)
                closed.append(node.id)

    def _close_scope(self, handle: Handle | None) -> list[Handle]:
        """The handles a Close of `handle` (None: the whole runtime) closes, leaf first."""
        if handle is not None:
            return handle.subtree_leaf_first()
        tops = [node for node in self.handles.values() if node.parent is None]
        return [node for top in tops for node in top.subtree_leaf_first()]

    async def resume(self, answer: Answer, lapsed: bool = False, request: RequestKey | None = None) -> TaskResult:
        """`lapsed`: the Request expired (an error result, however full the tenant's store is)."""

        async def resumed(replied: Replied) -> TaskResult:
            return await self.resumes.retried(answer)  # the same answer (the digest says so): its run's result

        return await self.once(request, "Resume", lambda: self.resumes.answer(answer, lapsed, request), resumed)

    def transcript(self, handle_id: str) -> list[Message]:
        return self.handle(handle_id).transcript_with_summaries()

    def inspect(self, handle_id: str) -> HandleSnapshot:
        return self.handle(handle_id).snapshot()

    def list_handles(self) -> list[HandleSnapshot]:
        return [handle.snapshot() for handle in self.handles.values()]

    def _check_wakeable(self, handle: Handle) -> None:
        if handle.state is HandleState.CLOSED:
            raise FailedPrecondition(f"handle {handle.id!r} is closed; spawn a new one", reason="HANDLE_CLOSED")
        closed = closed_ancestor(handle)
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
        if self.runs.get(handle.id) is not None:
            raise FailedPrecondition(
                f"handle {handle.id!r} is running; Post to its inbox, or Wait for it to settle",
                reason="HANDLE_RUNNING",
            )
