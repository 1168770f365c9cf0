"""All runtimes served by one process: created, read, run, recovered, drained and deleted.

A runtime is read without a side effect (`readable`, `loaded`): its journal is replayed and
nothing more. It runs in this process only once taken over (`take_over`): by a verb that
needs it (`runtime`), by recovery at start and on replicas whenever a dead replica's leases
lapse, and, on replicas, by the claim of its lease (the replica holding a runtime is the one
that runs it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Collection, Sequence

from ..clock import wait_at_most
from ..definitions.mcp_tools import with_mcp_tools
from ..definitions.same_objects import SameObjects
from ..definitions.validation import RUNTIME_ID, check_agents, check_options, check_runtime_id
from ..errors import (
    FieldViolation,
    InvalidArgument,
    NotFound,
    OwnedElsewhere,
    RequestIdReused,
    RequestIdTaken,
    RuntimeExists,
    Unavailable,
)
from ..journal import Configured
from ..ports import Leases, RuntimeRow, Services, TenantReply
from ..tenancy.process_counts import TenantQuotas
from ..tenancy.quotas import StreamQuota
from ..vocabulary import AgentSpec, RuntimeOptions
from ..watching.event_log import tell_gone
from .cache import RuntimeCache
from .request_ids import RequestKey
from .runtime import Runtime
from .tenant_replies import TenantReplies

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
CHECKED_KEPT = 64  # definitions objects known to pass their checks


def runtime_key(tenant: str, runtime_id: str) -> str:
    """The store's name of a tenant's runtime. Runtime ids are unique per tenant; `:` is in no
    slug, so keys never collide. The default tenant's keys are its ids (stores of 0.1.0)."""
    return runtime_id if tenant == DEFAULT_TENANT else f"{tenant}:{runtime_id}"


def new_runtime_id(now: float) -> str:
    """A fresh runtime id: the time of its creation (milliseconds, fixed width) before 64 random
    bits. Ids made later sort later, so the runtimes at work at any moment, the recent ones,
    share the store's B-tree pages (a commit writes a few pages for all of them, where random
    ids put each on a page of its own), and the random part keeps them unguessable."""
    return f"rt-{int(now * 1000):011x}{uuid.uuid4().hex[:16]}"


def split_key(key: str) -> tuple[str, str]:
    tenant, _, runtime_id = key.rpartition(":")
    return tenant or DEFAULT_TENANT, runtime_id


class RuntimeService:
    def __init__(
        self, services: Services, cache_size: int = 1000, quotas_for: Callable[[str], dict[str, int] | None] | None = None
    ) -> None:
        self.services = services
        self.cache = RuntimeCache(services, cache_size)
        self.tenancy = TenantQuotas(services, self.cache.runtimes, quotas_for)
        self.cache.tenancy = self.tenancy
        self._recovering: asyncio.Task[None] | None = None  # replicas: the takeover of dead replicas' runtimes under way
        self.recovered = 0  # handles continued from their journal since the start
        self.replies = TenantReplies(services)  # the answers of calls that create or delete runtimes
        self._checked: SameObjects[tuple[AgentSpec, ...], bool] = SameObjects(CHECKED_KEPT)
        services.leases.on_lost(self.cache.lost)
        # The store going away (docs/durability.md#store-unavailable): the copies it did not
        # write stop, and those that ran are taken over again from the store once it is back.
        self._take_back: set[str] = set()
        self._taking_back: asyncio.Task[None] | None = None
        services.store.on_unwritten(self._unwritten)
        services.store.on_health(self._store_health)

    @property
    def leases(self) -> Leases:
        return self.services.leases

    @property
    def draining(self) -> bool:
        return self.cache.draining

    @property
    def cached(self) -> int:
        return self.cache.cached

    @property
    def timers_armed(self) -> int:
        """Heartbeats and expiries armed over every runtime in memory (what taking over arms)."""
        return sum(runtime.timers.armed for runtime in self.cache.runtimes.values())

    def running_slots(self, tenant: str) -> tuple[int, int]:
        return self.tenancy.running_slots(tenant)

    def open_stream(self, quota: StreamQuota, tenant: str) -> contextlib.AbstractContextManager[None]:
        """Held while a stream of the tenant's is open here: a Watch following a runtime, a
        registered worker (the quota of them: QuotaExceeded)."""
        return self.tenancy.open_stream(quota, tenant)

    # ---- creating ------------------------------------------------------------------------

    async def new_key(self, runtime_id: str, tenant: str) -> tuple[str, str]:
        """A new runtime's id (the caller's, checked, or a fresh one) and key, if it may be created."""
        self._refuse_while_draining()
        if runtime_id:
            check_runtime_id(runtime_id)
        else:
            runtime_id = new_runtime_id(self.services.clock.time())
        key = runtime_key(tenant, runtime_id)
        await self._check_new(key, runtime_id, tenant)
        return runtime_id, key

    async def _check_new(self, key: str, runtime_id: str, tenant: str) -> None:
        if key in self.cache.runtimes or await self.services.store.runtime_exists(key):
            raise RuntimeExists(runtime_id)
        await self.tenancy.check_runtimes(tenant)
        await self.tenancy.check_store(tenant)

    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        found: Sequence[FieldViolation] = (),
        options: RuntimeOptions | None = None,
        tenant: str = DEFAULT_TENANT,
        request: RequestKey | None = None,
    ) -> str:
        """The id of the runtime created (`request`: or of the one the request id's first call
        created). `found`: what the edge found wrong decoding the definitions."""
        if request is None:
            return (await self._create(runtime_id, agents, found, options, tenant, None)).id

        async def create() -> str:
            return (await self._create(runtime_id, agents, found, options, tenant, request)).id

        return await self.replies.created_once("CreateRuntime", tenant, request, create)

    async def _create(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        found: Sequence[FieldViolation],
        options: RuntimeOptions | None,
        tenant: str,
        request: RequestKey | None,
    ) -> Runtime:
        self._refuse_while_draining()
        if runtime_id:
            check_runtime_id(runtime_id)
        else:
            runtime_id = new_runtime_id(self.services.clock.time())
        options = options or RuntimeOptions()
        self.check_definitions(agents, found, check_options(options, self.services))
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
        reply = None
        if request is not None:
            reply = TenantReply(tenant, "", request.id, "CreateRuntime", request.digest, runtime_id, self.services.clock.time())
        await self.services.store.create_runtime(key, agents, tenant, first, self.tenancy.quotas(tenant).runtimes, reply)
        self.tenancy.store_changed(tenant)  # its definitions count from the next check on
        self.cache.remember(runtime)
        await self.take_over(runtime)  # nothing to arm or continue yet: it is this process's from the start
        return runtime

    def check_definitions(
        self, agents: tuple[AgentSpec, ...], found: Sequence[FieldViolation], options: list[FieldViolation]
    ) -> None:
        """The definitions and options checked (InvalidArgument with every violation): the same
        definitions object (the edge's for the same AgentDefs) is checked once a process."""
        if found or self._checked.get(agents) is None:
            check_agents(agents, self.services.models.names, [*found, *options], self.services.egress)
            if not found:
                self._checked.put(agents, True)
        elif options:
            raise InvalidArgument(options)

    # ---- reading, and taking over -----------------------------------------------------------

    @staticmethod
    def key_of(runtime_id: str, tenant: str) -> str:
        if not RUNTIME_ID.fullmatch(runtime_id):
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        return runtime_key(tenant, runtime_id)

    async def runtime(self, runtime_id: str, tenant: str = DEFAULT_TENANT) -> Runtime:
        """A tenant's runtime, run by this process: loaded (`loaded`) and taken over, for a verb
        that changes it. Another tenant's answers exactly as one that does not exist: an id
        that is not a slug (`acme:demo`) names no runtime of any caller."""
        runtime = await self.cache.load(runtime_id, self.key_of(runtime_id, tenant))
        await self.take_over(runtime)
        return runtime

    async def loaded(self, runtime_id: str, tenant: str = DEFAULT_TENANT) -> Runtime:
        """A tenant's runtime as this process holds it, for a Watch or a Wait: loaded if it is
        not in memory, and not taken over by the load. On replicas its lease is taken (a live
        owner elsewhere: OwnedElsewhere, the call goes there), and a claimed lease is a
        take-over: while this replica lives, no other one would run it."""
        runtime = await self.cache.load(runtime_id, self.key_of(runtime_id, tenant))
        if self.leases.shared:
            await self.take_over(runtime)
        return runtime

    async def awaitable(self, runtime_id: str, tenant: str, handle_id: str) -> Runtime:
        """A runtime to Wait on one of its handles. A handle RUNNING in a journal no process
        runs (none of a runtime taken over: a store its last server left mid-run, unlisted at
        the start) goes on only if its runtime is taken over, so a Wait on it takes it over."""
        runtime = await self.loaded(runtime_id, tenant)
        if not runtime.taken_over:
            handle = runtime.tree.handles.get(handle_id)
            if handle is not None and handle.state.in_flight:
                await self.take_over(runtime)
        return runtime

    async def readable(self, runtime_id: str, tenant: str = DEFAULT_TENANT) -> Runtime:
        """A runtime to read (Inspect, List, GetTranscript): never taken over by the read.
        Replicas read one that another replica runs, or that nobody runs, from the database
        as acknowledged, without taking its lease."""
        return await self.cache.read(runtime_id, self.key_of(runtime_id, tenant))

    async def take_over(self, runtime: Runtime) -> None:
        """This process runs the runtime from now on (Runtime.take_over): its heartbeats and
        expiring Requests armed, what was running when its last process stopped continued."""
        self.recovered += await runtime.take_over()

    async def recover(self) -> int:
        """Every runtime that needs a process (a run in flight, a heartbeat, a Request that
        expires) and that no process runs is taken over: at start, and on replicas whenever
        another replica's leases lapse. Returns the handles continued."""
        before = self.recovered
        if self.leases.shared:
            keys = await self.leases.orphans()
        else:
            keys = await self.services.store.runtimes_with_running_handles()
        for key in keys:
            if self.draining:
                break
            found = self.cache.runtimes.get(key)
            if found is not None and found.taken_over and not found.journal.closed:
                continue
            tenant, runtime_id = split_key(key)
            with contextlib.suppress(OwnedElsewhere, NotFound):  # another replica came first; or deleted
                await self.runtime(runtime_id, tenant)
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
            self.cache.lost(key)
        await self.cache.drops()
        if self._recovering is None or self._recovering.done():
            self._recovering = asyncio.get_running_loop().create_task(self._recover_orphans())

    def _unwritten(self, keys: Collection[str]) -> None:
        for key in keys:
            runtime = self.cache.runtimes.get(key)
            if runtime is None or runtime.journal.closed:
                continue
            if runtime.taken_over:
                self._take_back.add(key)
            self.cache.unwritten(runtime)

    def _store_health(self, serving: bool) -> None:
        if serving and not self.draining and (self._taking_back is None or self._taking_back.done()):
            self._taking_back = asyncio.get_running_loop().create_task(self._back())

    async def _back(self) -> None:
        """The store is back: the runtimes whose copies stopped while it was away, and that
        ran here, are taken over again, so that their runs go on from their journal (on
        replicas, unless another replica took them meanwhile)."""
        keys, self._take_back = self._take_back, set()
        keys |= {key for key, runtime in self.cache.runtimes.items() if runtime.taken_over and runtime.journal.closed}
        for key in sorted(keys):
            if self.draining:
                return
            tenant, runtime_id = split_key(key)
            try:
                await self.runtime(runtime_id, tenant)
            except (OwnedElsewhere, NotFound):
                pass  # another replica runs it now, or it was deleted
            except Unavailable:
                self._take_back.add(key)  # away again: at its next return
            except Exception:
                log.exception("runtime %s: taking it over again after the store came back failed", key)
        if keys:
            log.info("took over again %d runtimes whose copies stopped while the store was away", len(keys))

    async def _recover_orphans(self) -> None:
        try:
            await self.recover()
        except Exception:  # the database may be back at the next round
            log.exception("taking over the runtimes of dead replicas failed")

    # ---- leaving -------------------------------------------------------------------------

    async def drain(self, grace: float) -> None:
        """Shutdown: runs stop at their next journal point; after `grace`, the rest are cut.
        Either way they stay RUNNING in the store and go on at the next start, or on
        replicas at once elsewhere: this process gives its leases up as it leaves."""
        self.cache.draining = True
        for claiming in (self._recovering, self._taking_back):  # it claims nothing more: what it claimed is given up below
            if claiming is not None:
                claiming.cancel()
                await asyncio.gather(claiming, return_exceptions=True)
        runtimes = list(self.cache.runtimes.values())
        for runtime in runtimes:
            runtime.draining = True
            runtime.events.close()
        await wait_at_most(self.services.clock, [task for runtime in runtimes for task in runtime.runs.tasks()], grace)
        for runtime in runtimes:
            runtime.timers.release()
            await runtime.runs.detach_all()
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

    async def list_runtimes(
        self, tenant: str, after: tuple[float, str] | None, limit: int, forks_of: str = ""
    ) -> list[RuntimeRow]:
        if forks_of and not RUNTIME_ID.fullmatch(forks_of):
            raise InvalidArgument([FieldViolation("forks_of", "a runtime id (a slug of at most 64 characters)")])
        return await self.services.store.list_runtimes(tenant, after, limit, forks_of)

    # ---- deleting ------------------------------------------------------------------------

    async def delete_runtime(
        self, runtime_id: str, force: bool, tenant: str = DEFAULT_TENANT, request: RequestKey | None = None
    ) -> None:
        """Closes the runtime (force: its running handles are interrupted) and deletes all of it.
        `request`: its answer is kept per tenant, in the delete's transaction, and outlives the
        runtime (a repeat is answered as the first was, not NOT_FOUND)."""
        if request is None:
            return await self._delete(runtime_id, force, tenant, None)
        async with self.replies.served.turn(f"{tenant}\n{runtime_id}\n{request.id}"):
            while True:
                if await self.replies.earlier(tenant, runtime_id, "DeleteRuntime", request) is not None:
                    return None
                await self._refuse_ids_of_the_runtime(runtime_id, tenant, request)
                reply = TenantReply(
                    tenant, runtime_id, request.id, "DeleteRuntime", request.digest, runtime_id, self.services.clock.time()
                )
                try:
                    return await self._delete(runtime_id, force, tenant, reply)
                except RequestIdTaken:
                    continue

    async def _refuse_ids_of_the_runtime(self, runtime_id: str, tenant: str, request: RequestKey) -> None:
        """A request id names one call per tenant and runtime: one the runtime's own calls
        recorded (a Spawn, a Post, ...: its journal) or the CreateRuntime that made it used is
        not this DeleteRuntime's (a DeleteRuntime's own answer is kept per tenant, not there)."""
        since = self.services.clock.time() - self.services.limits.request_id_ttl
        runtime = await self.runtime(runtime_id, tenant)
        created = await self.services.store.reply(tenant, "", request.id)
        if runtime.tree.replies.find(request.id, since) is not None or (
            created is not None and created.runtime_id == runtime_id and created.at >= since
        ):
            raise RequestIdReused(request.id, "DeleteRuntime")

    async def _delete(self, runtime_id: str, force: bool, tenant: str, reply: TenantReply | None) -> None:
        runtime = await self.runtime(runtime_id, tenant)
        runtime.timers.release()  # no heartbeat or lapse may start a run while it closes
        try:
            await runtime.close("root", force)
        except BaseException:
            runtime.timers.arm_all()  # a refused delete changes nothing: its timers run on
            raise
        if await self.cache.deleted(runtime.key) or runtime.journal.closed:
            # Another delete came first (DeleteRuntime, retention), or this copy was dropped
            # while it closed: again, from the store as that left it.
            return await self._delete(runtime_id, force, tenant, reply)
        await self._forget(runtime, reply)

    async def _forget(self, runtime: Runtime, reply: TenantReply | None = None) -> None:
        """Once the delete starts, the runtime is gone for every other call: its copy writes
        nothing more (NotFound) and a load waits until the store has deleted it. Else a call
        could write between the copy's last write and the store's delete (on PostgreSQL both
        await), be acknowledged, and lose its write: the commit finds no row to write to, or
        a copy loaded from the rows about to go lives on in memory."""
        key = runtime.key
        runtime.journal.closed = runtime.journal.deleted = True
        runtime.stop_timers()
        runtime.events.close(deleted=True)
        if self.cache.runtimes.get(key) is runtime:
            del self.cache.runtimes[key]
        async with self.cache.deciding(key):
            await self.services.store.delete_runtime(key, reply)
        self.tenancy.store_changed(runtime.tenant)

    async def delete_idle(self, retention: float, suspended_retention: float = 0.0) -> int:
        """Retention: every runtime with nothing running that no step was written to for
        `retention` seconds goes, or for `suspended_retention` if a handle waits on a Request
        (0: that kind stays for ever)."""
        now = self.services.clock.time()
        before = now - retention if retention else None
        suspended_before = now - suspended_retention if suspended_retention else None
        deleted = 0
        for key in await self.services.store.idle_runtimes(before, suspended_before):
            deleted += await self._delete_if_idle(key, before, suspended_before)
        if deleted:
            log.info("retention deleted %d idle runtimes", deleted)
        return deleted

    async def _delete_if_idle(self, key: str, before: float | None, suspended_before: float | None) -> bool:
        """The pass awaits between runtimes, so its listing may be stale by the time it gets to
        one: a call may have loaded it since, or written to it. Such a runtime is kept."""
        if self.cache.pending(key):
            return False
        runtime = self.cache.runtimes.get(key)
        reopen = False
        if runtime is not None:
            if runtime.busy:
                return False
            # A call that still holds this copy writes nothing more while the store decides
            # (Fenced: it retries); what it wrote before is in the store, and keeps the runtime.
            # An idle runtime is not closed first: Closed steps are writes, and would keep it.
            reopen = not runtime.journal.closed  # a copy closed already is dead: it stays so
            runtime.journal.closed = True
            del self.cache.runtimes[key]
        deleted = False
        try:
            async with self.cache.deciding(key):
                deleted = await self.services.store.delete_if_idle(key, before, suspended_before)
                if deleted:
                    self.tenancy.store_changed(split_key(key)[0])
        finally:
            if runtime is not None and reopen and not deleted:  # written since the listing: the copy carries on
                runtime.journal.closed = False
                self.cache.remember(runtime)
            elif runtime is not None:
                runtime.journal.deleted = deleted  # a call that still holds the copy is told it was deleted
                runtime.stop_timers()
                runtime.events.close(deleted=deleted)
            elif deleted:  # not in memory (evicted): observers may still count its pending handles
                tell_gone(self.services.observers, key, self.services.clock.time())
        return deleted
