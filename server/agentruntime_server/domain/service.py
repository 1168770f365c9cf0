"""All runtimes served by one process. The store is the source of truth: a runtime with no
run in flight may be dropped from memory and is loaded back when it is next addressed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence

from .errors import (
    FieldViolation,
    InvalidArgument,
    NotFound,
    OwnedElsewhere,
    RuntimeExists,
    Unavailable,
)
from .events import tell_gone
from .gate import FifoGate
from .journal import Configured
from .mcp_tools import with_mcp_tools
from .model import AgentSpec, RuntimeOptions
from .ports import Leases, RuntimeRow, Services
from .quotas import (
    DAY_MINUTES,
    QuotaExceeded,
    Quotas,
    SpawnWindow,
    TokenLedger,
    handles_per_minute_reached,
    runtimes_quota_reached,
    store_bytes_reached,
)
from .runtime import Runtime
from .validation import RUNTIME_ID, check_agents, check_options, check_runtime_id

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
# Seconds a tenant's bytes in the store, as last read, are trusted for a check that passes: the
# store is read at most this often per tenant, not at every Post (one round trip on PostgreSQL).
# A figure at or past the quota is read again before a call is refused, and a CreateRuntime or
# a DeleteRuntime of the tenant has it read again at the next check.
STORE_BYTES_RECHECK = 1.0
TENANT_PRUNE_SECONDS = 60.0


def runtime_key(tenant: str, runtime_id: str) -> str:
    """The store's name of a tenant's runtime. Runtime ids are unique per tenant; `:` is in no
    slug, so keys never collide. The default tenant's keys are its ids (stores of 0.1.0)."""
    return runtime_id if tenant == DEFAULT_TENANT else f"{tenant}:{runtime_id}"


def split_key(key: str) -> tuple[str, str]:
    tenant, _, runtime_id = key.rpartition(":")
    return tenant or DEFAULT_TENANT, runtime_id


class RuntimeService:
    def __init__(
        self, services: Services, cache_size: int = 1000, quotas_for: Callable[[str], dict[str, int] | None] | None = None
    ) -> None:
        self.services = services
        # A tenant's own quotas over the server's (the edge knows them: the tokens file).
        self.quotas_for = quotas_for
        self.cache_size = cache_size
        self._runtimes: OrderedDict[str, Runtime] = OrderedDict()
        self.draining = False
        self._ledger = TokenLedger()
        self._merged: dict[str, tuple[dict[str, int], Quotas]] = {}  # tenant -> (its own quotas, merged)
        self._running_gates: dict[str, FifoGate] = {}  # tenant -> its running slots (running-handles quota)
        self._spawns = SpawnWindow()
        self._store_bytes: dict[str, tuple[int, float]] = {}  # tenant -> (bytes, when read: monotonic)
        self._tenants_pruned = time.monotonic()
        self._loading: dict[str, asyncio.Future[Runtime]] = {}  # key -> the load under way
        self._deleting: dict[str, asyncio.Future[None]] = {}  # key -> the store's delete under way
        self._ledger_loaded: set[str] = set()
        self._ledger_loading: dict[str, asyncio.Future[None]] = {}  # tenant -> its ledger's read under way
        self._ledger_pruned = -1  # the minute this process last had the store forget older ledger rows
        self._dropping: set[asyncio.Task[None]] = set()
        self._releasing: set[asyncio.Task[None]] = set()
        self._taking_over: asyncio.Task[None] | None = None  # replicas: the takeover under way
        self.recovered = 0  # handles continued from their journal since the start
        services.leases.on_lost(self.lost)

    # ---- quotas (Tenancy) ------------------------------------------------------------------

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
        now = time.monotonic()
        if now - self._tenants_pruned < TENANT_PRUNE_SECONDS:
            return
        self._tenants_pruned = now
        live = {runtime.tenant for runtime in self._runtimes.values()}
        for tenant in [t for t, gate in self._running_gates.items() if t not in live and not gate.held and not gate.waiting]:
            del self._running_gates[tenant]
        self._spawns.forget_idle()
        for tenant in [t for t, (_, read) in self._store_bytes.items() if now - read > STORE_BYTES_RECHECK]:
            del self._store_bytes[tenant]

    def count_spawn(self, tenant: str) -> None:
        self._forget_idle_tenants()
        quota = self.quotas(tenant).handles_per_minute
        if quota and not self._spawns.admit(tenant, quota):
            raise handles_per_minute_reached(tenant, quota)

    async def check_store(self, tenant: str) -> None:
        quota = self.quotas(tenant).store_bytes
        if not quota:
            return
        now = time.monotonic()
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

    async def spend(self, tenant: str, tokens: int) -> None:
        if not self.quotas(tenant).tokens_per_day:
            return
        await self._load_ledger(tenant)
        minute = self._ledger.spend(tenant, tokens)
        await self.services.store.add_tokens(tenant, minute, tokens)
        if minute != self._ledger_pruned:
            self._ledger_pruned = minute
            await self._prune_ledger(minute)

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
            since = int(time.time() // 60) - DAY_MINUTES
            self._ledger.load(tenant, await self.services.store.tokens_since(tenant, since))
            self._ledger_loaded.add(tenant)
        finally:
            self._ledger_loading.pop(tenant, None)

    async def _check_runtimes(self, tenant: str) -> None:
        quota = self.quotas(tenant).runtimes
        if quota and await self.services.store.count_runtimes(tenant) >= quota:
            raise runtimes_quota_reached(tenant, quota)

    async def _check_new(self, key: str, runtime_id: str, tenant: str) -> None:
        if key in self._runtimes or await self.services.store.runtime_exists(key):
            raise RuntimeExists(runtime_id)
        await self._check_runtimes(tenant)
        await self.check_store(tenant)

    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        found: Sequence[FieldViolation] = (),
        options: RuntimeOptions | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Runtime:
        """`found`: what the edge found wrong while decoding the definitions."""
        self._refuse_while_draining()
        if runtime_id:
            check_runtime_id(runtime_id)
        else:
            runtime_id = f"rt-{uuid.uuid4().hex[:16]}"
        options = options or RuntimeOptions()
        check_agents(agents, self.services.models.names, [*found, *check_options(options, self.services)], self.services.egress)
        key = runtime_key(tenant, runtime_id)
        if any(agent.mcp_servers for agent in agents):
            # Only definitions that are otherwise right, for a runtime that may be created,
            # reach out to their MCP servers.
            await self._check_new(key, runtime_id, tenant)
            agents, unlisted = await with_mcp_tools(agents, self.services.mcp)
            if unlisted:
                raise InvalidArgument(unlisted)
            check_agents(agents, self.services.models.names, urls=self.services.egress)  # the listed tools, schemas and all
        await self._check_new(key, runtime_id, tenant)
        runtime = Runtime(runtime_id, agents, self.services, key)
        first = runtime.journal.first(Configured(options)) if options != RuntimeOptions() else []
        # One step in the store, which has the last word: the runtime with its options (a crash
        # between two writes left one without them, its id taken), and the tenant's runtimes
        # counted with the insert (creates at once, here or on other replicas, would each count
        # before the others' inserts: the check above is only the early answer).
        await self.services.store.create_runtime(key, agents, tenant, first, self.quotas(tenant).runtimes)
        self._store_bytes.pop(tenant, None)  # its definitions count from the next check on
        self._remember(runtime)
        return runtime

    @property
    def leases(self) -> Leases:
        return self.services.leases

    async def runtime(self, runtime_id: str, tenant: str = DEFAULT_TENANT) -> Runtime:
        """A tenant's runtime, executed by this process (taking its lease if no live replica
        holds it; OwnedElsewhere if one does). Another tenant's answers exactly as one that
        does not exist: an id that is not a slug (`acme:demo`) names no runtime of any caller."""
        key = self._key(runtime_id, tenant)
        found = self._runtimes.get(key)
        if found is not None:
            await self.leases.confirm()
            found = self._runtimes.get(key)
        if found is not None:
            if self.leases.holds(key) and not found.journal.closed:
                self._runtimes.move_to_end(key)
                return found
            await self._drop(found)  # its lease was lost, or the store refused a write of it: this copy must not act again
        loading = self._loading.get(key)
        if loading is not None:  # another caller is loading it (a store whose reads await): share its copy
            return await asyncio.shield(loading)
        deleting = self._deleting.get(key)
        if deleting is not None:  # being deleted (retention: unless it was written since): as the store decides
            await asyncio.shield(deleting)
            return await self.runtime(runtime_id, tenant)
        future: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            runtime = await self._load(runtime_id, key)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: a waiter may or may not be there
            raise
        finally:
            self._loading.pop(key, None)
        future.set_result(runtime)
        return runtime

    async def readable(self, runtime_id: str, tenant: str = DEFAULT_TENANT) -> Runtime:
        """A runtime to read (Inspect, List, GetTranscript). Replicas read one that another
        replica runs, or that nobody runs, from the database as acknowledged, without taking
        its lease; a process on its own store reads its own copy."""
        if not self.leases.shared:
            return await self.runtime(runtime_id, tenant)
        key = self._key(runtime_id, tenant)
        if key in self._runtimes:
            await self.leases.confirm()
        found = self._runtimes.get(key)
        if found is not None and self.leases.holds(key) and not found.journal.closed:
            return found
        stored = await self.services.store.load(key)
        if stored is None:
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        return Runtime.restore(runtime_id, stored, self.services, key)

    @staticmethod
    def _key(runtime_id: str, tenant: str) -> str:
        if not RUNTIME_ID.fullmatch(runtime_id):
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        return runtime_key(tenant, runtime_id)

    async def _load(self, runtime_id: str, key: str) -> Runtime:
        """Takes the runtime over: its lease, then its journal, then whatever was running."""
        if self.draining and self.leases.shared:  # leaving: another replica takes it
            raise Unavailable(f"this replica is shutting down; retry runtime {runtime_id!r} at another replica")
        if self.leases.shared:
            # What a dropped copy of it appended is committed (or refused) under its own lease
            # before a new one is taken: no write of it can land, or vanish, after the claim.
            await self.services.store.flush()
        claim = await self.leases.claim(key)
        if not claim.exists:
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        if not claim.owned:
            raise OwnedElsewhere(runtime_id, claim.address)
        stored = await self.services.store.load(key)
        if stored is None:  # deleted since the claim
            await self.leases.release(key)
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        runtime = Runtime.restore(runtime_id, stored, self.services, key)
        runtime.arm_timers()
        if self.draining:
            runtime.draining = True
            runtime.events.close()
        self._remember(runtime)
        if not self.draining:
            # Handles RUNNING in the journal: their process died (or handed them over).
            self.recovered += await runtime.recover()
        return runtime

    async def recover(self) -> int:
        """Every runtime with running handles that no process executes goes on from its
        journal: at start, and on replicas whenever another replica's leases lapse."""
        before = self.recovered
        if self.leases.shared:
            keys = await self.leases.orphans()
        else:
            keys = await self.services.store.runtimes_with_running_handles()
        for key in keys:
            if self.draining:
                break
            if key in self._runtimes or key in self._loading:
                continue
            with contextlib.suppress(OwnedElsewhere, NotFound):  # another replica came first; or deleted
                await self.runtime(split_key(key)[1], split_key(key)[0])
        continued = self.recovered - before
        if continued:
            log.info("recovered %d running handles from the store", continued)
        return continued

    async def keep_leases(self) -> None:
        """Replicas, every third of a lease: renew this process's leases, stop what it lost,
        and take over the runtimes of replicas that died. The takeover goes on beside the next
        renewals, never in their way: a claim waits on its row as long as another transaction
        holds it, and a replica that stopped renewing meanwhile would lose all it runs."""
        for key in await self.leases.renew():
            self.lost(key)
        await asyncio.gather(*self._dropping)
        if self._taking_over is None or self._taking_over.done():
            self._taking_over = asyncio.get_running_loop().create_task(self._take_over())

    async def _take_over(self) -> None:
        try:
            await self.recover()
        except Exception:  # the database may be back at the next round
            log.exception("taking over the runtimes of dead replicas failed")

    def lost(self, key: str) -> None:
        """The runtime's lease is gone (the store refused a write, or renewal found it taken)."""
        runtime = self._runtimes.get(key)
        if runtime is not None and not self.leases.holds(key):
            task = asyncio.get_running_loop().create_task(self._drop(runtime))
            self._dropping.add(task)
            task.add_done_callback(self._dropping.discard)

    async def _drop(self, runtime: Runtime) -> None:
        """This copy stops at once and writes nothing more: the replica that holds the lease
        now goes on from the journal. Its watchers and waiters are told to retry."""
        runtime.journal.closed = True
        if self._runtimes.get(runtime.key) is runtime:
            del self._runtimes[runtime.key]
            log.warning("runtime %s: its lease is lost or a write failed; its copy stops (the journal goes on)", runtime.key)
        runtime.stop_timers()
        runtime.events.close()
        await runtime.detach_runs()

    async def drain(self, grace: float) -> None:
        """Shutdown: runs stop at their next journal point; after `grace`, the rest are cut.
        Either way they stay RUNNING in the store and go on at the next start, or on
        replicas at once elsewhere: this process gives its leases up as it leaves."""
        self.draining = True
        if self._taking_over is not None:  # it claims nothing more: what it claimed is given up below
            self._taking_over.cancel()
            await asyncio.gather(self._taking_over, return_exceptions=True)
        runtimes = list(self._runtimes.values())
        for runtime in runtimes:
            runtime.draining = True
            runtime.events.close()
        tasks = [h.run.task for rt in runtimes for h in rt.handles.values() if h.run is not None and h.run.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for runtime in runtimes:
            runtime.release_timers()
            await runtime.detach_runs()
        if self.leases.shared:
            with contextlib.suppress(Exception):  # a broken store: the leases lapse instead
                await self.services.store.flush()
                await self.leases.release_all()

    async def acknowledge(self, runtime_key: str | None = None) -> None:
        """Called before any reply leaves: what the call did is durable (and, for a runtime,
        accepted: a replica that lost its lease raises Fenced)."""
        await self.services.store.flush(runtime_key)

    def _refuse_while_draining(self) -> None:
        if self.draining:
            # UNAVAILABLE, as every other call refused by a shutdown: a retry elsewhere succeeds.
            raise Unavailable("the server is shutting down; retry against its replacement")

    async def list_runtimes(self, tenant: str, after: tuple[float, str] | None, limit: int) -> list[RuntimeRow]:
        return await self.services.store.list_runtimes(tenant, after, limit)

    async def delete_runtime(self, runtime_id: str, force: bool, tenant: str = DEFAULT_TENANT) -> None:
        """Closes the runtime (force: its running handles are interrupted) and deletes all of it."""
        runtime = await self.runtime(runtime_id, tenant)
        runtime.release_timers()  # no heartbeat or lapse may start a run while it closes
        try:
            await runtime.close("root", force)
        except BaseException:
            runtime.arm_timers()  # a refused delete changes nothing: its timers run on
            raise
        deleting = self._deleting.get(runtime.key)
        if deleting is not None or runtime.journal.closed:
            # Another delete came first (DeleteRuntime, retention), or this copy was dropped
            # while it closed: again, from the store as that left it.
            if deleting is not None:
                await asyncio.shield(deleting)
            return await self.delete_runtime(runtime_id, force, tenant)
        await self._forget(runtime)

    async def _forget(self, runtime: Runtime) -> None:
        """Once the delete starts, the runtime is gone for every other call: its copy writes
        nothing more (NotFound) and a load waits until the store has deleted it. Else a call
        could write between the copy's last write and the store's delete (on PostgreSQL both
        await), be acknowledged, and lose its write: the commit finds no row to write to, or
        a copy loaded from the rows about to go lives on in memory."""
        key = runtime.key
        runtime.journal.closed = runtime.journal.deleted = True
        runtime.stop_timers()
        runtime.events.close(deleted=True)
        if self._runtimes.get(key) is runtime:
            del self._runtimes[key]
        async with self._deciding(key):
            await self.services.store.delete_runtime(key)
        self._store_bytes.pop(runtime.tenant, None)

    @contextlib.asynccontextmanager
    async def _deciding(self, key: str) -> AsyncIterator[None]:
        """While the store deletes the runtime (or decides not to), a load of it waits
        (`runtime`), so it cannot write under the delete."""
        decided = asyncio.get_running_loop().create_future()
        self._deleting[key] = decided
        try:
            yield
        finally:
            del self._deleting[key]
            decided.set_result(None)

    async def delete_idle(self, retention: float) -> int:
        """Retention: every runtime no step was written to for `retention` seconds goes."""
        before = time.time() - retention
        deleted = 0
        for key in await self.services.store.idle_runtimes(before):
            deleted += await self._delete_if_idle(key, before)
        if deleted:
            log.info("retention deleted %d idle runtimes", deleted)
        return deleted

    async def _delete_if_idle(self, key: str, before: float) -> bool:
        """The pass awaits between runtimes, so its listing may be stale by the time it gets to
        one: a call may have loaded it since, or written to it. Such a runtime is kept."""
        if key in self._loading or key in self._deleting:
            return False
        runtime = self._runtimes.get(key)
        reopen = False
        if runtime is not None:
            if runtime.busy:
                return False
            # A call that still holds this copy writes nothing more while the store decides
            # (Fenced: it retries); what it wrote before is in the store, and keeps the runtime.
            # An idle runtime is not closed first: Closed steps are writes, and would keep it.
            reopen = not runtime.journal.closed  # a copy closed already is dead: it stays so
            runtime.journal.closed = True
            del self._runtimes[key]
        deleted = False
        try:
            async with self._deciding(key):
                deleted = await self.services.store.delete_if_idle(key, before)
                if deleted:
                    self._store_bytes.pop(split_key(key)[0], None)
        finally:
            if runtime is not None and reopen and not deleted:  # written since the listing: the copy carries on
                runtime.journal.closed = False
                self._remember(runtime)
            elif runtime is not None:
                runtime.journal.deleted = deleted  # a call that still holds the copy is told it was deleted
                runtime.stop_timers()
                runtime.events.close(deleted=deleted)
            elif deleted:  # not in memory (evicted): observers may still count its pending handles
                tell_gone(self.services.observers, key)
        return deleted

    def _remember(self, runtime: Runtime) -> None:
        runtime.tenancy = self
        self._runtimes[runtime.key] = runtime
        self._runtimes.move_to_end(runtime.key)
        if not self.services.store.durable:
            return
        while len(self._runtimes) > self.cache_size:
            idle = next((rt for rt in self._runtimes.values() if not rt.busy and rt is not runtime), None)
            if idle is None:
                return  # everything in memory is working: keep it all
            idle.release_timers()
            del self._runtimes[idle.key]
            if self.leases.shared:
                task = asyncio.get_running_loop().create_task(self._release(idle.key))
                self._releasing.add(task)
                task.add_done_callback(self._releasing.discard)

    async def _release(self, key: str) -> None:
        with contextlib.suppress(Exception):  # a lease not given up lapses on its own
            await self.services.store.flush()
            if key not in self._runtimes and key not in self._loading:
                await self.leases.release(key)

    @property
    def cached(self) -> int:
        return len(self._runtimes)
