"""Each tenant's quotas, as one process counts them (the Tenancy a runtime asks): its running
handles and their slots, the handles it spawns a minute, its bytes in the store, the model
tokens it spent over the last day (kept in the store too, so a restart forgets none), and
the Watch and ServeTools streams it has open."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from ..fifo_gate import FifoGate
from ..journal.tree import Tree
from ..limits import Quotas
from ..ports import Services
from ..vocabulary import Limit
from .quotas import (
    DAY_MINUTES,
    QuotaExceeded,
    SpawnWindow,
    StreamQuota,
    TokenLedger,
    handles_per_minute_reached,
    runtimes_quota_reached,
    store_bytes_reached,
    streams_quota_reached,
)

log = logging.getLogger(__name__)

# Seconds a tenant's bytes in the store, as last read, are trusted for a check that passes: the
# store is read at most this often per tenant, not at every Post (one round trip on PostgreSQL).
# A figure at or past the quota is read again before a call is refused, and a CreateRuntime or
# a DeleteRuntime of the tenant has it read again at the next check.
STORE_BYTES_RECHECK = 1.0
TENANT_PRUNE_SECONDS = 60.0


class CountedRuntime(Protocol):
    """What the counts read of a runtime in this process's memory (runtime.Runtime)."""

    @property
    def tenant(self) -> str: ...

    @property
    def tree(self) -> Tree: ...


class TenantQuotas:
    def __init__(
        self,
        services: Services,
        runtimes: Mapping[str, CountedRuntime],
        quotas_for: Callable[[str], dict[str, int] | None] | None = None,
    ) -> None:
        """`runtimes`: those in this process's memory (every one with a run in flight is)."""
        self.services = services
        self._runtimes = runtimes
        # A tenant's own quotas over the server's (the edge knows them: the tokens file).
        self.quotas_for = quotas_for
        self._ledger = TokenLedger(services.clock)
        self._merged: dict[str, tuple[dict[str, int], Quotas]] = {}  # tenant -> (its own quotas, merged)
        self._running_gates: dict[str, FifoGate] = {}  # tenant -> its running slots (running-handles quota)
        self._spawns = SpawnWindow(services.clock)
        self._store_bytes: dict[str, tuple[int, float]] = {}  # tenant -> (bytes, when read: monotonic)
        self._tenants_pruned = services.clock.monotonic()
        self._ledger_loaded: set[str] = set()
        self._ledger_loading: dict[str, asyncio.Future[None]] = {}  # tenant -> its ledger's read under way
        self._ledger_pruned = -1  # the minute this process last had the store forget older ledger rows
        # tenant -> (tokens, micros) the model turns under way in this process are reserved
        # (reservations.py): in memory only, never journaled or stored.
        self._held: dict[str, tuple[int, int]] = {}
        self._streams: dict[tuple[StreamQuota, str], int] = {}  # (kind, tenant) -> open here (none: no key)

    def quotas(self, tenant: str) -> Quotas:
        own = self.quotas_for(tenant) if self.quotas_for is not None else None
        if not own:
            return self.services.quotas
        merged = self._merged.get(tenant)
        if merged is None or merged[0] is not own:  # asked at every run and spawn: merged once per tokens file
            merged = self._merged[tenant] = (own, dataclasses.replace(self.services.quotas, **own))
        return merged[1]

    def check_running(self, tenant: str) -> None:
        quota = self.quotas(tenant).running_handles
        if not quota:
            return
        # A runtime with a run in flight is always in memory: counting memory counts them all.
        running = sum(runtime.tree.running for runtime in self._runtimes.values() if runtime.tenant == tenant)
        if running >= quota:
            raise QuotaExceeded(
                tenant,
                "running_handles",
                f"tenant {tenant!r} has {running} running handles, its quota (AGENTRUNTIME_QUOTA_RUNNING_HANDLES); "
                "Wait for some to settle",
            )

    def running_gate(self, tenant: str) -> FifoGate | None:
        """The tenant's running slots, one gate for all its runtimes in this process, sized to
        its quota as it is now (a tokens file reloaded with another quota resizes it)."""
        quota = self.quotas(tenant).running_handles
        gate = self._running_gates.get(tenant)
        if not quota:
            if gate is not None:  # the quota was lifted: whoever still waits goes in
                del self._running_gates[tenant]
                gate.resize(sys.maxsize)
            return None
        if gate is None:
            gate = self._running_gates[tenant] = FifoGate(quota)
        elif gate.capacity != quota:
            gate.resize(quota)
        return gate

    def running_slots(self, tenant: str) -> tuple[int, int]:
        """(slots held, runs waiting for one) of the tenant's running-handles quota, in this process."""
        gate = self._running_gates.get(tenant)
        return (gate.held, gate.waiting) if gate is not None else (0, 0)

    def _forget_idle_tenants(self) -> None:
        """At most once a minute, what is kept per tenant for its quotas is dropped for tenants
        with nothing in flight here: a gate no run of a runtime in memory can hold (a run keeps
        its runtime in memory), a spawn window with nothing in its minute, a stale byte count."""
        now = self.services.clock.monotonic()
        if now - self._tenants_pruned < TENANT_PRUNE_SECONDS:
            return
        self._tenants_pruned = now
        live = {runtime.tenant for runtime in self._runtimes.values()}
        for tenant in [t for t, gate in self._running_gates.items() if t not in live and not gate.held and not gate.waiting]:
            del self._running_gates[tenant]
        self._spawns.forget_idle()
        for tenant in [t for t, (_, read) in self._store_bytes.items() if now - read > STORE_BYTES_RECHECK]:
            del self._store_bytes[tenant]

    @contextlib.contextmanager
    def open_stream(self, quota: StreamQuota, tenant: str) -> Iterator[None]:
        """One of the tenant's streams of a kind, held open in this process (a Watch while it
        follows a runtime here, a ServeTools once its worker registered); QuotaExceeded at the
        tenant's quota of them. What one holds is bounded (a Watch: a page of history and its
        queue; a worker: its registration and its calls): this bounds how many."""
        limit = getattr(self.quotas(tenant), quota)
        key = (quota, tenant)
        open_now = self._streams.get(key, 0)
        if limit and open_now >= limit:
            raise streams_quota_reached(quota, tenant, limit)
        self._streams[key] = open_now + 1
        try:
            yield
        finally:
            left = self._streams[key] - 1
            if left:
                self._streams[key] = left
            else:
                del self._streams[key]  # (what is kept per tenant never outlives its use)

    def streams(self, quota: StreamQuota, tenant: str) -> int:
        """The tenant's streams of a kind open in this process."""
        return self._streams.get((quota, tenant), 0)

    def count_spawn(self, tenant: str) -> None:
        self._forget_idle_tenants()
        quota = self.quotas(tenant).handles_per_minute
        if quota and not self._spawns.admit(tenant, quota):
            raise handles_per_minute_reached(tenant, quota)

    async def check_store(self, tenant: str) -> None:
        quota = self.quotas(tenant).store_bytes
        if not quota:
            return
        now = self.services.clock.monotonic()
        seen = self._store_bytes.get(tenant)
        if seen is None or seen[0] >= quota or now - seen[1] > STORE_BYTES_RECHECK:
            seen = (await self.services.store.tenant_bytes(tenant), now)
            self._store_bytes[tenant] = seen
        if seen[0] >= quota:
            raise store_bytes_reached(tenant, seen[0], quota)

    async def tokens_left(self, tenant: str) -> int | None:
        quota = self.quotas(tenant).tokens_per_day
        if not quota:
            return None
        await self._load_ledger(tenant)
        return quota - self._ledger.spent(tenant)

    async def cost_left(self, tenant: str) -> int | None:
        quota = self.quotas(tenant).cost_per_day
        if not quota:
            return None
        await self._load_ledger(tenant)
        return quota - self._ledger.spent_micros(tenant)

    async def spend(self, tenant: str, tokens: int, micros: int = 0) -> None:
        quotas = self.quotas(tenant)
        if not quotas.tokens_per_day and not quotas.cost_per_day:
            return
        await self._load_ledger(tenant)
        minute = self._ledger.spend(tenant, tokens, micros)
        await self.services.store.add_tokens(tenant, minute, tokens, micros)
        if minute != self._ledger_pruned:
            self._ledger_pruned = minute
            await self._prune_ledger(minute)

    def caps_spend(self, tenant: str) -> bool:
        quotas = self.quotas(tenant)
        return bool(quotas.tokens_per_day or quotas.cost_per_day)

    async def reserve(self, tenant: str, tokens: int, micros: int) -> tuple[Limit, str] | None:
        quotas = self.quotas(tenant)
        await self._load_ledger(tenant)
        # No await from here on: the check and the hold are one step for every turn of the tenant.
        held_tokens, held_micros = self._held.get(tenant, (0, 0))
        spent = self._ledger.spent(tenant)
        if quotas.tokens_per_day and spent + held_tokens + tokens > quotas.tokens_per_day:
            return Limit.MAX_TOKENS, (
                f"stopped: the tenant's model token quota for the last 24 hours cannot cover the next turn, reserved"
                f" {tokens:,} tokens: {quotas.tokens_per_day:,} less {spent:,} spent and {held_tokens:,} held by turns"
                f" under way leaves {max(quotas.tokens_per_day - spent - held_tokens, 0):,}"
            )
        spent = self._ledger.spent_micros(tenant)
        if quotas.cost_per_day and spent + held_micros + micros > quotas.cost_per_day:
            return Limit.MAX_COST, (
                f"stopped: the tenant's model cost quota for the last 24 hours cannot cover the next turn, reserved"
                f" {micros:,} micros: {quotas.cost_per_day:,} less {spent:,} spent and {held_micros:,} held by turns"
                f" under way leaves {max(quotas.cost_per_day - spent - held_micros, 0):,}"
            )
        self._held[tenant] = (held_tokens + tokens, held_micros + micros)
        return None

    def release(self, tenant: str, tokens: int, micros: int) -> None:
        held_tokens, held_micros = self._held.get(tenant, (0, 0))
        held_tokens, held_micros = held_tokens - tokens, held_micros - micros
        if held_tokens <= 0 and held_micros <= 0:
            self._held.pop(tenant, None)
        else:
            self._held[tenant] = (held_tokens, held_micros)

    async def _prune_ledger(self, minute: int) -> None:
        """Rows of minutes no quota reads any more go, every tenant's, at most once a minute
        (one turn a minute pays for it, not every turn). The cutoff is a minute older than the
        day the ledger reads: a replica whose clock is up to a minute behind still finds its day."""
        try:
            await self.services.store.forget_tokens_before(minute - DAY_MINUTES - 1)
        except Exception:  # housekeeping: the turn stands, and the next minute tries again
            log.warning("forgetting token counts older than a day failed", exc_info=True)

    async def _load_ledger(self, tenant: str) -> None:
        """The tenant's spend of the last day, read from the store once. Everyone who asks
        meanwhile waits for that read (on PostgreSQL it awaits): handles going on together
        after a restart would otherwise take the ledger as empty and pass a quota used up
        before it. A read that fails is tried again by the next caller."""
        if tenant in self._ledger_loaded:
            return
        loading = self._ledger_loading.get(tenant)
        if loading is None:
            loading = asyncio.ensure_future(self._read_ledger(tenant))
            loading.add_done_callback(lambda done: done.cancelled() or done.exception())  # its waiters may all be gone
            self._ledger_loading[tenant] = loading
        await asyncio.shield(loading)  # one caller cancelled (an Interrupt) stops nobody else's read

    async def _read_ledger(self, tenant: str) -> None:
        try:
            since = int(self.services.clock.time() // 60) - DAY_MINUTES
            self._ledger.load(tenant, await self.services.store.tokens_since(tenant, since))
            self._ledger_loaded.add(tenant)
        finally:
            self._ledger_loading.pop(tenant, None)

    async def check_runtimes(self, tenant: str) -> None:
        quota = self.quotas(tenant).runtimes
        if quota and await self.services.store.count_runtimes(tenant) >= quota:
            raise runtimes_quota_reached(tenant, quota)

    def store_changed(self, tenant: str) -> None:
        """The tenant's runtimes took or gave back room in the store: read it again at the next check."""
        self._store_bytes.pop(tenant, None)
