"""A runtime's timers: each open handle with a heartbeat ticks, each live Request with an
expiry lapses when it passes. Only a runtime this process has taken over arms them
(Runtime.take_over); a copy loaded to be read arms none."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from ..clock import Timer
from ..errors import DomainError
from ..journal import Journal, Ticked, Tree
from ..journal.handle import Handle
from ..ports import Services
from ..runs.driver import RunDriver, closed_ancestor
from ..tenancy.quotas import QuotaExceeded, Tenancy
from ..vocabulary import Answer, HandleState, PendingRequest, TaskResult

LAPSE_RETRY_SECONDS = 1.0  # an expired Request the tenant's running-handles quota holds back lapses this much later


class TimersHost(Protocol):
    """What the timers need from their runtime."""

    tree: Tree
    journal: Journal
    tenant: str
    tenancy: Tenancy | None
    draining: bool
    runs: RunDriver
    services: Services

    async def resume(self, answer: Answer, lapsed: bool = False) -> TaskResult: ...


class Timers:
    def __init__(self, host: TimersHost) -> None:
        self.host = host  # a weak proxy: nothing the runtime holds refers back to it
        self._heartbeats: dict[str, Timer] = {}  # handle id -> its next tick
        self._lapses: dict[str, Timer] = {}  # request id -> its expiry

    @property
    def armed(self) -> int:
        return len(self._heartbeats) + len(self._lapses)

    @property
    def beating(self) -> bool:
        return bool(self._heartbeats)

    def arm_all(self) -> None:
        """A runtime taken over: every live Request that expires lapses on time, every heartbeat beats."""
        for request in [handle.pending for handle in self.host.tree.requests.values()]:
            if request is not None:
                self.arm_lapse(request)
        for handle in self.host.tree.handles.values():
            self.arm_heartbeat(handle)

    def release(self) -> None:
        """The runtime leaves memory (evicted, deleted, shut down): no timer of this copy may
        act again; the copy that takes it over next arms its own."""
        for timer in [*self._heartbeats.values(), *self._lapses.values()]:
            timer.cancel()
        self._heartbeats.clear()
        self._lapses.clear()

    # ---- heartbeats ----------------------------------------------------------------------

    def arm_heartbeat(self, handle: Handle) -> None:
        """Schedules the handle's next tick. After downtime the periods missed come due at
        once, as one tick that counts them (no burst)."""
        beat = handle.agent.heartbeat
        if beat is None or handle.state is HandleState.CLOSED or self.host.draining:
            return
        clock = self.host.services.clock
        now = clock.time()
        due = (handle.last_tick or now) + beat.every
        replaced = self._heartbeats.get(handle.id)
        if replaced is not None:  # one chain of ticks a handle, however often it is armed
            replaced.cancel()
        self._heartbeats[handle.id] = clock.call_later(max(due - now, 0.0), lambda: _spawn(self._beat(handle)))

    def disarm_heartbeat(self, handle_id: str) -> None:
        timer = self._heartbeats.pop(handle_id, None)
        if timer is not None:
            timer.cancel()

    async def _beat(self, handle: Handle) -> None:
        host = self.host
        self._heartbeats.pop(handle.id, None)
        beat = handle.agent.heartbeat
        if beat is None or handle.state is HandleState.CLOSED or host.draining:
            return
        now = host.services.clock.time()
        missed = max(int((now - handle.last_tick) // beat.every), 1) if handle.last_tick else 1
        await host.journal.record(Ticked(handle.id, now, missed))
        self.arm_heartbeat(handle)
        if handle.state is HandleState.IDLE and host.runs.get(handle.id) is None and closed_ancestor(handle) is None:
            if host.tenancy is not None:
                try:
                    host.tenancy.check_running(host.tenant)
                except QuotaExceeded:
                    return  # a beat starts a run as a Wake does; the tick waits in the inbox for the next one
            await host.runs.start_run(handle, "")

    # ---- expiring Requests ---------------------------------------------------------------

    def arm_lapse(self, request: PendingRequest, at_least: float = 0.0) -> None:
        if request.expires_at is None or self.host.draining:
            return
        clock = self.host.services.clock
        delay = max(request.expires_at - clock.time(), at_least)
        replaced = self._lapses.get(request.id)
        if replaced is not None:
            replaced.cancel()
        self._lapses[request.id] = clock.call_later(delay, lambda: _spawn(self._lapse(request.id)))

    async def _lapse(self, request_id: str) -> None:
        """An expired Request that nobody answered: its call becomes an error result."""
        host = self.host
        self._lapses.pop(request_id, None)
        if request_id in host.tree.requests and not host.draining:
            try:
                await host.resume(Answer(id=request_id, ok=False, reason="the request expired"), lapsed=True)
            except QuotaExceeded:
                # The run goes on as after a Resume, so it waits for room in the tenant's quota.
                leaf = host.tree.requests.get(request_id)
                if leaf is not None and leaf.pending is not None:
                    self.arm_lapse(leaf.pending, at_least=LAPSE_RETRY_SECONDS)
            except DomainError:
                pass


def _spawn(work: Coroutine[Any, Any, None]) -> None:
    """A timer's work, as a task of its own on the running loop."""
    asyncio.get_running_loop().create_task(work)
