"""ForkRuntime and ReplayRuntime: runtimes made from another's journal (forks.py, replays.py),
created the way CreateRuntime creates one (the tenant's quotas, a request id's answer kept in
the creating write). The source is read, never written. docs/fork-and-replay.md"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from ..definitions.mcp_tools import with_mcp_tools
from ..errors import FieldViolation, InvalidArgument
from ..journal import Configured, Entry
from ..ports import Origin, StoredRuntime, TenantReply
from ..vocabulary import AgentSpec, RuntimeOptions, UnrecordedCalls
from . import forks, replays
from .request_ids import RequestKey
from .runtime import Runtime
from .service import RuntimeService

SETTLED_POLL = 0.05  # seconds between looks at a replay whose roots no task of this process runs


class Branches:
    def __init__(self, service: RuntimeService) -> None:
        self.service = service

    async def fork(
        self,
        source_id: str,
        at_seq: int,
        fork_id: str,
        changes: forks.ForkChanges,
        found: Sequence[FieldViolation] = (),
        tenant: str = "default",
        request: RequestKey | None = None,
    ) -> Runtime:
        """The fork (`request`: or the one the request id's first call made)."""

        async def make() -> str:
            return (await self._fork(source_id, at_seq, fork_id, changes, found, tenant, request)).id

        return await self.service.readable(await self._once("ForkRuntime", tenant, request, make), tenant)

    async def replay(
        self,
        source_id: str,
        replacements: tuple[AgentSpec, ...],
        unrecorded: UnrecordedCalls,
        replay_id: str,
        found: Sequence[FieldViolation] = (),
        tenant: str = "default",
        request: RequestKey | None = None,
    ) -> Runtime:
        """The replay, created (`request`: or the one the request id's first call made) and
        driven: its roots go through their recorded runs (replays.driving)."""

        async def make() -> str:
            return (await self._replay(source_id, replacements, unrecorded, replay_id, found, tenant, request)).id

        made = await self._once("ReplayRuntime", tenant, request, make)
        runtime = await self.service.runtime(made, tenant)  # taken over: its runs go on here
        replays.driving(runtime)
        return runtime

    async def _once(self, rpc: str, tenant: str, request: RequestKey | None, make: Callable[[], Awaitable[str]]) -> str:
        """The id of the runtime `make` creates, or (`request`) of the one the request id's first call made."""
        return await (make() if request is None else self.service.replies.created_once(rpc, tenant, request, make))

    async def _source(self, source_id: str, tenant: str, upto_event: int | None = None) -> StoredRuntime:
        """The source as acknowledged: whole, or (a fork's) up to the step that made `upto_event`."""
        service = self.service
        key = service.key_of(source_id, tenant)
        store = service.services.store
        await store.flush()  # what this process appended of it is in the store
        stored = await (store.load(key) if upto_event is None else store.load_until(key, upto_event))
        return forks.source_of(stored, source_id)

    async def _definitions(
        self, source: tuple[AgentSpec, ...], replacements: tuple[AgentSpec, ...], found: Sequence[FieldViolation]
    ) -> tuple[tuple[AgentSpec, ...], tuple[str, ...]]:
        """The new runtime's definitions (the source's, replaced by name), checked as CreateRuntime's."""
        service = self.service
        agents, replaced = forks.merged(source, replacements)
        if replacements or found:
            service.check_definitions(agents, found, [])
        if any(agent.mcp_servers for agent in replacements):
            # Only definitions that are otherwise right reach out to their MCP servers.
            replacements, unlisted = await with_mcp_tools(replacements, service.services.mcp)
            if unlisted:
                raise InvalidArgument(unlisted)
            agents, replaced = forks.merged(source, replacements)
            service.check_definitions(agents, (), [])  # the listed tools, schemas and all
        return agents, replaced

    async def _fork(
        self,
        source_id: str,
        at_seq: int,
        fork_id: str,
        changes: forks.ForkChanges,
        found: Sequence[FieldViolation],
        tenant: str,
        request: RequestKey | None,
    ) -> Runtime:
        stored = await self._source(source_id, tenant, max(at_seq, 0))
        prefix, fork_seq = forks.cut(stored, at_seq)
        agents, replaced = await self._definitions(stored.agents, changes.agents, found)
        fork_id, key = await self.service.new_key(fork_id, tenant)
        runtime, entries = forks.build(
            fork_id, key, source_id, prefix, fork_seq, agents, replaced, changes, self.service.services
        )
        origin = Origin(source_id, fork_seq, runtime.tree.counts, runtime.tree.active)
        return await self._store(runtime, agents, entries, origin, "ForkRuntime", request)

    async def _replay(
        self,
        source_id: str,
        replacements: tuple[AgentSpec, ...],
        unrecorded: UnrecordedCalls,
        replay_id: str,
        found: Sequence[FieldViolation],
        tenant: str,
        request: RequestKey | None,
    ) -> Runtime:
        stored = await self._source(source_id, tenant)
        agents, replaced = await self._definitions(stored.agents, replacements, found)
        replay_id, key = await self.service.new_key(replay_id, tenant)
        services = self.service.services
        recording = Runtime.restore(source_id, stored, services, self.service.key_of(source_id, tenant))
        replaying = replays.plan(recording.tree, stored.entries, {agent.name: agent for agent in agents}, replaced, unrecorded)
        runtime = Runtime(replay_id, agents, services, key)
        options = recording.tree.options
        entries = runtime.journal.first(
            *([Configured(options)] if options != RuntimeOptions() else []), *replays.first_steps(replaying)
        )
        origin = Origin(source_id, 0, runtime.tree.counts, runtime.tree.active)
        return await self._store(runtime, agents, entries, origin, "ReplayRuntime", request)

    async def _store(
        self,
        runtime: Runtime,
        agents: tuple[AgentSpec, ...],
        entries: list[Entry],
        origin: Origin,
        rpc: str,
        request: RequestKey | None,
    ) -> Runtime:
        """Stored whole, in one write with the request id's answer, or not at all."""
        service = self.service
        reply = None
        if request is not None:
            now = service.services.clock.time()
            reply = TenantReply(runtime.tenant, "", request.id, rpc, request.digest, runtime.id, now)
        quota = service.tenancy.quotas(runtime.tenant).runtimes
        await service.services.store.create_runtime(runtime.key, agents, runtime.tenant, entries, quota, reply, origin)
        runtime.journal.stored()
        service.tenancy.store_changed(runtime.tenant)
        service.cache.remember(runtime)
        await service.take_over(runtime)
        return runtime


async def replay_settled(runtime: Runtime, timeout: float | None) -> bool:
    """Waits until the replay's roots have settled (True), or `timeout` passed (False)."""
    try:
        async with runtime.services.clock.deadline(timeout):
            while not replays.settled(runtime):
                driver = replays.driving(runtime)
                runs = [run.task for handle in runtime.tree.handles.values() if (run := runtime.runs.get(handle.id)) and run.task]
                # (asyncio.wait cancels none of them when this call is cancelled: they go on)
                done, _ = await asyncio.wait([driver, *runs], return_when=asyncio.FIRST_COMPLETED)
                if driver in done and not driver.cancelled() and driver.exception() is not None:
                    raise driver.exception()  # type: ignore[misc]
                if driver.done() and not runs:  # a run in flight with no task here (its copy is not this process's)
                    await runtime.services.clock.sleep(SETTLED_POLL)
    except TimeoutError:
        return False
    return True
