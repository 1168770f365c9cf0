"""Per-tenant quotas: live runtimes, running handles, model tokens per rolling day.

The edge authenticates the tenant; these count what each tenant uses. Token spend is kept
per minute for the last day, in memory and in the store (so a restart forgets nothing)."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Protocol

from .errors import ResourceExhausted

DAY_MINUTES = 24 * 60


@dataclass(frozen=True)
class Quotas:
    """0: no quota."""

    runtimes: int = 0
    running_handles: int = 0
    tokens_per_day: int = 0


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


class Tenancy(Protocol):
    """What a runtime asks of the service about its tenant's quotas."""

    def check_running(self, tenant: str) -> None:
        """Raises QuotaExceeded when the tenant may not start another run now."""
        ...

    async def tokens_left(self, tenant: str) -> int | None:
        """Tokens the tenant may still spend today; None: no quota."""
        ...

    async def spend(self, tenant: str, tokens: int) -> None: ...


class TokenLedger:
    """Model tokens spent per tenant per minute over the last day."""

    def __init__(self) -> None:
        self._minutes: dict[str, deque[tuple[int, int]]] = defaultdict(deque)
        self._totals: dict[str, int] = defaultdict(int)

    def load(self, tenant: str, spent: list[tuple[int, int]]) -> None:
        for minute, tokens in spent:
            self.spend(tenant, tokens, minute)

    def spend(self, tenant: str, tokens: int, minute: int | None = None) -> int:
        """Counts the tokens; the minute they are counted in."""
        minute = int(time.time() // 60) if minute is None else minute
        buckets = self._minutes[tenant]
        if buckets and buckets[-1][0] == minute:
            buckets[-1] = (minute, buckets[-1][1] + tokens)
        else:
            buckets.append((minute, tokens))
        self._totals[tenant] += tokens
        return minute

    def spent(self, tenant: str) -> int:
        """Tokens spent in the last 24 hours."""
        oldest = int(time.time() // 60) - DAY_MINUTES
        buckets = self._minutes.get(tenant)
        while buckets and buckets[0][0] <= oldest:
            self._totals[tenant] -= buckets.popleft()[1]
        return self._totals.get(tenant, 0)
