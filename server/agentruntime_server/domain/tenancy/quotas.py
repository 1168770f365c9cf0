"""Per-tenant quotas: live runtimes, running handles, handles created per minute, bytes in
the store, model tokens and their cost per rolling day, Watch and ServeTools streams open.

The edge authenticates the tenant; these count what each tenant uses. Token spend (and its
cost) is kept per minute for the last day, in memory and in the store (so a restart forgets nothing).
Running slots, the handles created in the last minute and the streams open are counted in
memory, per process."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import ResourceExhausted
from ..fifo_gate import FifoGate
from ..vocabulary import Limit

DAY_MINUTES = 24 * 60
MINUTE = 60.0


class QuotaExceeded(ResourceExhausted):
    def __init__(self, tenant: str, quota: str, message: str) -> None:
        super().__init__(message, reason="QUOTA_EXCEEDED")
        self.subject = f"tenant:{tenant}"
        self.quota = quota


def runtimes_quota_reached(tenant: str, quota: int) -> QuotaExceeded:
    return QuotaExceeded(
        tenant,
        "runtimes",
        f"tenant {tenant!r} has {quota} runtimes, its quota (AGENTRUNTIME_QUOTA_RUNTIMES); DeleteRuntime one first",
    )


def handles_per_minute_reached(tenant: str, quota: int) -> QuotaExceeded:
    return QuotaExceeded(
        tenant,
        "handles_per_minute",
        f"tenant {tenant!r} created {quota} handles in the last minute, its quota "
        "(AGENTRUNTIME_QUOTA_HANDLES_PER_MINUTE); spawn again later",
    )


def store_bytes_reached(tenant: str, used: int, quota: int) -> QuotaExceeded:
    return QuotaExceeded(
        tenant,
        "store_bytes",
        f"tenant {tenant!r} has {used:,} bytes in the store, at or past its quota of {quota:,} "
        "(AGENTRUNTIME_QUOTA_STORE_BYTES); DeleteRuntime what it no longer needs",
    )


StreamQuota = Literal["watch_streams", "worker_streams"]
_STREAMS = {"watch_streams": "Watch streams", "worker_streams": "ServeTools streams (workers)"}


def streams_quota_reached(quota: StreamQuota, tenant: str, limit: int) -> QuotaExceeded:
    return QuotaExceeded(
        tenant,
        quota,
        f"tenant {tenant!r} has {limit} {_STREAMS[quota]} open, its quota (AGENTRUNTIME_QUOTA_{quota.upper()}); close one first",
    )


class Tenancy(Protocol):
    """What a runtime asks of the service about its tenant's quotas."""

    def check_running(self, tenant: str) -> None:
        """Raises QuotaExceeded when the tenant may not start another run now."""
        ...

    def running_gate(self, tenant: str) -> FifoGate | None:
        """The tenant's running slots (its running-handles quota); None: no quota."""
        ...

    def count_spawn(self, tenant: str) -> None:
        """Counts a handle about to be created; QuotaExceeded past the tenant's handles per minute."""
        ...

    async def check_store(self, tenant: str) -> None:
        """Raises QuotaExceeded when the tenant's runtimes fill its share of the store."""
        ...

    async def tokens_left(self, tenant: str) -> int | None:
        """Tokens the tenant may still spend today; None: no quota."""
        ...

    async def cost_left(self, tenant: str) -> int | None:
        """Micro-units the tenant may still spend today; None: no quota."""
        ...

    async def spend(self, tenant: str, tokens: int, micros: int = 0) -> None: ...

    def caps_spend(self, tenant: str) -> bool:
        """The tenant has a quota of tokens or cost per day: a turn must be reserved against it."""
        ...

    async def reserve(self, tenant: str, tokens: int, micros: int) -> tuple[Limit, str] | None:
        """Holds a turn's reservation against the tenant's quotas of tokens and cost per day;
        when it does not fit (with what the day spent and the turns under way hold), the
        limit its stop names and why, and nothing is held."""
        ...

    def release(self, tenant: str, tokens: int, micros: int) -> None:
        """A reservation `reserve` held ends (the reply's spend is counted, or there is none)."""
        ...


class TokenLedger:
    """Model tokens spent per tenant per minute over the last day, and what they cost."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._minutes: dict[str, deque[tuple[int, int, int]]] = defaultdict(deque)  # (minute, tokens, micros)
        self._totals: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))

    def load(self, tenant: str, spent: list[tuple[int, int, int]]) -> None:
        for minute, tokens, micros in spent:
            self.spend(tenant, tokens, micros, minute)

    def spend(self, tenant: str, tokens: int, micros: int = 0, minute: int | None = None) -> int:
        """Counts the tokens and their cost; the minute they are counted in."""
        minute = int(self.clock.time() // 60) if minute is None else minute
        buckets = self._minutes[tenant]
        if buckets and buckets[-1][0] == minute:
            _, before, cost = buckets[-1]
            buckets[-1] = (minute, before + tokens, cost + micros)
        else:
            buckets.append((minute, tokens, micros))
        total, total_cost = self._totals[tenant]
        self._totals[tenant] = (total + tokens, total_cost + micros)
        return minute

    def spent(self, tenant: str) -> int:
        """Tokens spent in the last 24 hours."""
        return self._last_day(tenant)[0]

    def spent_micros(self, tenant: str) -> int:
        """What the tokens spent in the last 24 hours cost."""
        return self._last_day(tenant)[1]

    def _last_day(self, tenant: str) -> tuple[int, int]:
        oldest = int(self.clock.time() // 60) - DAY_MINUTES
        buckets = self._minutes.get(tenant)
        while buckets and buckets[0][0] <= oldest:
            _, tokens, micros = buckets.popleft()
            total, total_cost = self._totals[tenant]
            self._totals[tenant] = (total - tokens, total_cost - micros)
        return self._totals.get(tenant, (0, 0))


class SpawnWindow:
    """Handles created per tenant in the last minute (a rolling window): the times of the
    latest ones, never more than the quota of them."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._times: dict[str, deque[float]] = {}

    def admit(self, tenant: str, quota: int) -> bool:
        """Counts one more unless `quota` were created in the last minute."""
        now = self.clock.monotonic()
        times = self._times.get(tenant)
        if times is None:
            times = self._times[tenant] = deque()
        while times and times[0] <= now - MINUTE:
            times.popleft()
        if len(times) >= quota:
            return False
        times.append(now)
        return True

    @property
    def tenants(self) -> int:
        """How many tenants it keeps times for."""
        return len(self._times)

    def forget_idle(self) -> None:
        """Tenants with no handle created in the last minute are forgotten (tenants of JWTs are
        as many as an issuer names: what is kept for each must not outlive its use)."""
        oldest = self.clock.monotonic() - MINUTE
        for tenant in [tenant for tenant, times in self._times.items() if not times or times[-1] <= oldest]:
            del self._times[tenant]


class RunningSlot:
    """A run's hold on one of its tenant's running slots (a FifoGate of the running-handles
    quota). The run holds a slot while it works: its model turns and its own tool calls. While
    all it does is wait for its children (task calls, a judge, a summarizer) it lends the slot
    out, and takes one back (QUEUED if it has to wait) before its next work: a tree's waiting
    handles hold no slot, so the children they wait for always get one, and no tree deadlocks.

    `busy` counts the run's activities that are not waiting for a child: its loop, or while
    its loop waits for a phase of tool calls, each of those calls."""

    __slots__ = ("_lock", "busy", "gate", "held", "record")

    def __init__(self, gate: FifoGate, record: Callable[[bool], Awaitable[None]]) -> None:
        self.gate = gate
        self.record = record  # journals the handle QUEUED (True) or RUNNING again (False)
        self.busy = 1  # the run's loop
        self.held = False
        self._lock: asyncio.Lock | None = None

    async def hold(self) -> None:
        """Before work: a slot, unless the run holds one already (its activities share it)."""
        if self.held:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one activity takes it; the others find it held
            if self.held:
                return
            if not self.gate.would_wait:
                await self.gate.acquire()
                self.held = True
                return
            await self.record(True)
            await self.gate.acquire()
            self.held = True  # before the next await: a cancellation from here on cannot leak it
            await self.record(False)

    def join(self, activities: int = 1) -> None:
        self.busy += activities

    def leave(self) -> None:
        """An activity ends or waits for a child: the last one lends the slot out."""
        self.busy -= 1
        if self.busy <= 0 and self.held:
            self.held = False
            self.gate.release()

    def close(self) -> None:
        """The run is over (however it ended)."""
        self.busy = 0
        if self.held:
            self.held = False
            self.gate.release()
