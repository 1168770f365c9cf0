"""Worker tools: hosts connected over ServeTools run calls inline in the turn.

A worker registers on a queue of its tenant, for some tools (or all of the queue's), with a
bound on the calls it holds at once. A call goes to the connected worker of its queue that
serves its tool and holds the fewest calls (ties in turn), never past that worker's bound.
With no such worker the call waits for one up to its timeout, then fails as an error
result. Sent, it has its timeout again to be answered: a worker that goes away, or holds a
call past that deadline, leaves the call in doubt (WorkerLost), and the turn loop applies
the tool's `on_interrupted` policy (an answer in hand when the deadline fires still counts).
But a call still queued for a worker's stream, or taken by the stream but not yet sent (it
verifies the host's credential again first), never left the process and is not in doubt: if
the worker goes, the call goes to the next worker as if it had just been made; if its
deadline passes first (the host reads slowly, or its identity provider answers slowly), it is
withdrawn, never sent, and goes to another worker free then, or fails as taken by none; if
its turn stops, it is withdrawn. A call a worker kept past its deadline still counts against that
worker's bound until it answers (late: the output is dropped) or goes away, and the call is
never given to that worker again: another worker gets it, or none does and the result says so.
A call in doubt stays in doubt: when no worker takes its retry, the result names the workers
that took it (the turn loop passes those that went away) and says it may have taken effect."""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..domain.errors import Unavailable
from ..domain.ports import Dispatch, WorkerLost
from ..domain.vocabulary import ToolCall, ToolResult, WorkerExecutor

log = logging.getLogger(__name__)

MISSED_KEPT = 1024  # per worker: the calls it missed that it is not given again


class Outbox(asyncio.Queue["Dispatch | None"]):
    """The calls a worker's stream has yet to send (None: the stream ends). A call still here,
    or the one the stream took last but has not said it sends (`sending`), never left the
    process, so it can be taken back."""

    def _init(self, maxsize: int) -> None:
        self._queue: collections.deque[Dispatch | None] = collections.deque()
        self._taken: Dispatch | None = None

    def _get(self) -> Dispatch | None:
        self._taken = self._queue.popleft()
        return self._taken

    def sending(self, dispatch: Dispatch) -> bool:
        """The stream sends the call it took: False when it was withdrawn meanwhile (never send it)."""
        if self._taken is not dispatch:
            return False
        self._taken = None
        return True

    def withdraw(self, dispatch: Dispatch) -> bool:
        """False when the stream is sending the call (it may have reached the host)."""
        if self._taken is dispatch:
            self._taken = None
            return True
        try:
            self._queue.remove(dispatch)
        except ValueError:
            return False
        return True

    def take_back(self) -> list[Dispatch]:
        """Every call the stream never sent; the outbox is left empty."""
        unsent = [dispatch for dispatch in (self._taken, *self._queue) if dispatch is not None]
        self._taken = None
        self._queue.clear()
        return unsent


@dataclass(eq=False)
class Worker:
    tenant: str
    queue: str
    tools: frozenset[str]  # empty: every tool of the queue
    limit: int
    id: str = field(default_factory=lambda: f"worker-{uuid.uuid4().hex[:12]}")
    outbox: Outbox = field(default_factory=Outbox)
    in_hand: dict[str, asyncio.Future[ToolResult]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # dispatch id -> the call's idempotency key
    order: int = 0  # ties between equally busy workers go in turn
    gone: bool = False
    # Idempotency keys of calls this worker kept past their deadline (the newest
    # MISSED_KEPT): a retry of such a call goes to another worker, never back to it.
    missed: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def serves(self, tool: str) -> bool:
        return not self.tools or tool in self.tools

    def may_take(self, tool: str, key: str) -> bool:
        return self.free and self.serves(tool) and key not in self.missed and not self.holds(key)

    def holds(self, key: str) -> bool:
        return key in self.keys.values()

    def missed_call(self, key: str) -> None:
        self.missed[key] = None
        self.missed.move_to_end(key)
        while len(self.missed) > MISSED_KEPT:
            self.missed.popitem(last=False)

    @property
    def free(self) -> bool:
        return not self.gone and len(self.in_hand) < self.limit

    def answer(self, dispatch_id: str, result: ToolResult) -> bool:
        """The worker's output for a call it holds; False when it holds no such call (late,
        or never sent to it)."""
        future = self.in_hand.get(dispatch_id)
        if future is None or future.done():
            return False
        future.set_result(result)
        return True


class _Unsent(Exception):
    """The worker went away before its stream sent the call."""


def _taken_and_lost(executor: WorkerExecutor, missed: list[str], gone: list[str]) -> ToolResult:
    """The result of a call in doubt that no other worker took: who took it, and that it may have run."""
    if missed:
        told = f"worker {', '.join(missed)} of queue {executor.queue!r} took the call and did not answer by its deadline"
        told += f" (worker {', '.join(gone)} went away with it)" if gone else ""
    else:
        told = f"worker {', '.join(gone)} of queue {executor.queue!r} took the call and went away without answering"
    return ToolResult(
        f"{told}, and no other worker took it within {executor.timeout:g}s: it may or may not have taken effect", is_error=True
    )


class WorkerPool:
    """Every connected worker, by (tenant, queue). Implements the domain's WorkerToolRunner."""

    def __init__(self) -> None:
        self._queues: dict[tuple[str, str], list[Worker]] = {}
        self._changed: dict[tuple[str, str], asyncio.Condition] = {}
        self._waiting: dict[tuple[str, str], int] = {}  # calls waiting for a free worker, by queue
        self._turns = itertools.count()
        self._notifying: set[asyncio.Task[None]] = set()
        self.closed = False

    def close(self) -> None:
        """Shutdown (after the runs have stopped): every worker's stream ends, so its host
        reconnects to another server, and none registers any more."""
        self.closed = True
        for workers in self._queues.values():
            for worker in workers:
                worker.outbox.put_nowait(None)

    def _condition(self, place: tuple[str, str]) -> asyncio.Condition:
        condition = self._changed.get(place)
        if condition is None:
            condition = self._changed[place] = asyncio.Condition()
        return condition

    async def connect(self, tenant: str, queue: str, tools: Sequence[str], limit: int) -> Worker:
        if self.closed:
            raise Unavailable("the server is shutting down; connect the worker to its replacement")
        worker = Worker(tenant, queue, frozenset(tools), limit)
        place = (tenant, queue)
        self._queues.setdefault(place, []).append(worker)
        log.info("worker %s serves queue %s of tenant %s (%d at once)", worker.id, queue, tenant, limit)
        await self._notify(place)
        return worker

    async def disconnect(self, worker: Worker) -> None:
        """The worker is gone (its stream has ended): every call it held is in doubt, but those
        its stream never sent."""
        worker.gone = True
        place = (worker.tenant, worker.queue)
        workers = self._queues.get(place, [])
        if worker in workers:
            workers.remove(worker)
        if not workers:
            self._queues.pop(place, None)
        unsent = {dispatch.id for dispatch in worker.outbox.take_back()}
        for dispatch_id, future in list(worker.in_hand.items()):
            if not future.done():
                lost = WorkerLost(f"worker {worker.id} went away with the call", worker.id)
                future.set_exception(_Unsent() if dispatch_id in unsent else lost)
        log.info("worker %s left queue %s of tenant %s", worker.id, worker.queue, worker.tenant)
        await self._notify(place)

    async def _notify(self, place: tuple[str, str]) -> None:
        if not self._waiting.get(place):
            return  # nobody waits for a worker of this queue: the common case costs nothing
        condition = self._condition(place)
        async with condition:
            condition.notify_all()

    def _pick(self, place: tuple[str, str], tool: str, key: str, passed_over: set[Worker]) -> Worker | None:
        ready = [worker for worker in self._queues.get(place, []) if worker.may_take(tool, key) and worker not in passed_over]
        return min(ready, key=lambda worker: (len(worker.in_hand), worker.order), default=None)

    def _missed_by(self, place: tuple[str, str], tool: str, key: str) -> list[str]:
        """The connected workers of the queue that kept this call past a deadline, or hold it still."""
        return [
            worker.id
            for worker in self._queues.get(place, [])
            if worker.serves(tool) and (key in worker.missed or worker.holds(key))
        ]

    def _forget(self, place: tuple[str, str], key: str) -> None:
        """The call has its result: a later call with the same key may go to any worker."""
        for worker in self._queues.get(place, []):
            worker.missed.pop(key, None)

    async def run(
        self,
        tenant: str,
        executor: WorkerExecutor,
        call: ToolCall,
        key: str,
        runtime_id: str,
        handle_id: str,
        lost: Sequence[str] = (),
    ) -> ToolResult:
        place = (tenant, executor.queue)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + executor.timeout
        condition = self._condition(place)
        passed_over: set[Worker] = set()  # whose stream did not send the call by its deadline
        while True:  # again when the worker it went to did not send it (it left, or its stream is backed up)
            async with condition:
                worker = self._pick(place, call.name, key, passed_over)
                while worker is None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        missed = self._missed_by(place, call.name, key)
                        gone = [worker_id for worker_id in lost if worker_id not in missed]  # took it, then left
                        self._forget(place, key)
                        if missed or gone:  # a worker took the call before: it is in doubt, not taken by none
                            return _taken_and_lost(executor, missed, gone)
                        why = (
                            f"the stream of worker {', '.join(passed.id for passed in passed_over)} did not send it "
                            "by its deadline: is its host reading its calls?"
                            if passed_over
                            else "is a host serving it with ServeTools?"
                        )
                        return ToolResult(
                            f"no worker of queue {executor.queue!r} took the call within {executor.timeout:g}s ({why})",
                            is_error=True,
                        )
                    self._waiting[place] = self._waiting.get(place, 0) + 1
                    try:
                        # Not wait_for: on Python 3.11 it waits in a task of its own, and a turn stopped
                        # twice while that task took the lock back left the lock taken for good (every
                        # later registration and call of the queue hung). Here the wait is this task's.
                        async with asyncio.timeout(remaining):
                            await condition.wait()
                    except TimeoutError:
                        continue
                    finally:
                        self._waiting[place] -= 1
                    worker = self._pick(place, call.name, key, passed_over)
                # The worker has the whole timeout, from now, to answer.
                answer_by = time.time() + executor.timeout
                dispatch = Dispatch(f"{worker.id}/{next(self._turns)}", call, key, runtime_id, handle_id, answer_by)
                future: asyncio.Future[ToolResult] = loop.create_future()
                worker.in_hand[dispatch.id] = future
                worker.keys[dispatch.id] = key
                worker.order = next(self._turns)
            kept = False
            try:
                worker.outbox.put_nowait(dispatch)
                # Not wait_for: an answer that came in the tick the deadline fired is in hand, and wins.
                await asyncio.wait((future,), timeout=executor.timeout)
                if not future.done():
                    if worker.outbox.withdraw(dispatch):  # never sent: not taken, so not in doubt
                        passed_over.add(worker)
                        continue
                    if not worker.gone:
                        # It may be running the call still: it keeps its place in the worker's bound
                        # until it answers (the late output is dropped) or the worker goes away.
                        kept = True
                        worker.missed_call(key)
                        future.add_done_callback(functools.partial(self._release, worker, dispatch.id, place))
                    raise WorkerLost(f"worker {worker.id} kept the call past its deadline of {executor.timeout:g}s", worker.id)
                try:
                    result = future.result()
                except _Unsent:
                    continue
                self._forget(place, key)
                return result
            finally:
                if not kept:
                    worker.outbox.withdraw(dispatch)  # a call whose turn stopped is never sent afterwards
                    self._drop(worker, dispatch.id)
                    if not future.done():
                        future.cancel()
                    elif not future.cancelled():
                        future.exception()  # a WorkerLost set as the turn stopped: nobody reads it, not an error
                    await self._notify(place)

    @staticmethod
    def _drop(worker: Worker, dispatch_id: str) -> None:
        worker.in_hand.pop(dispatch_id, None)
        worker.keys.pop(dispatch_id, None)

    def _release(self, worker: Worker, dispatch_id: str, place: tuple[str, str], future: asyncio.Future[ToolResult]) -> None:
        """A call kept past its deadline is over at last (a late answer, or the worker left):
        the worker's place is free again."""
        if not future.cancelled():
            future.exception()  # the WorkerLost of a worker that left: expected, not logged as never retrieved
        self._drop(worker, dispatch_id)
        if self._waiting.get(place):
            task = asyncio.ensure_future(self._notify(place))
            self._notifying.add(task)
            task.add_done_callback(self._notifying.discard)
