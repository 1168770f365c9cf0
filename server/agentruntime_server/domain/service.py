"""All runtimes served by one process. The store is the source of truth: a runtime with no
run in flight may be dropped from memory and is loaded back when it is next addressed."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence

from .errors import AlreadyExists, FailedPrecondition, FieldViolation, NotFound
from .journal import Configured
from .model import AgentSpec, RuntimeOptions
from .ports import Services
from .runtime import Runtime
from .validation import check_agents, check_options, check_runtime_id

log = logging.getLogger(__name__)


class RuntimeService:
    def __init__(self, services: Services, cache_size: int = 1000) -> None:
        self.services = services
        self.cache_size = cache_size
        self._runtimes: OrderedDict[str, Runtime] = OrderedDict()
        self.draining = False

    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        found: Sequence[FieldViolation] = (),
        options: RuntimeOptions | None = None,
    ) -> Runtime:
        """`found`: what the edge found wrong while decoding the definitions."""
        self._refuse_while_draining()
        if runtime_id:
            check_runtime_id(runtime_id)
        else:
            runtime_id = f"rt-{uuid.uuid4().hex[:16]}"
        options = options or RuntimeOptions()
        check_agents(agents, self.services.models.names, [*found, *check_options(options, self.services)])
        if runtime_id in self._runtimes or await self.services.store.runtime_exists(runtime_id):
            raise AlreadyExists(f"runtime {runtime_id!r} already exists; choose another id or leave it empty")
        runtime = Runtime(runtime_id, agents, self.services)
        await self.services.store.create_runtime(runtime_id, agents)
        if options != RuntimeOptions():
            await runtime.journal.record(Configured(options))
        self._remember(runtime)
        return runtime

    async def runtime(self, runtime_id: str) -> Runtime:
        found = self._runtimes.get(runtime_id)
        if found is not None:
            self._runtimes.move_to_end(runtime_id)
            return found
        # The store's reads do not yield to the event loop, so two callers never load twice.
        stored = await self.services.store.load(runtime_id)
        if stored is None:
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        runtime = Runtime.restore(runtime_id, stored, self.services)
        runtime.arm_timers()
        if self.draining:
            runtime.draining = True
            runtime.events.close()
        self._remember(runtime)
        return runtime

    async def recover(self) -> int:
        """At start: every handle that was RUNNING when the process died goes on from its journal."""
        continued = 0
        for runtime_id in await self.services.store.runtimes_with_running_handles():
            stored = await self.services.store.load(runtime_id)
            if stored is None:
                continue
            runtime = Runtime.restore(runtime_id, stored, self.services)
            runtime.arm_timers()
            self._remember(runtime)
            continued += await runtime.recover()
        if continued:
            log.info("recovered %d running handles from the store", continued)
        return continued

    async def drain(self, grace: float) -> None:
        """Shutdown: runs stop at their next journal point; after `grace`, the rest are cut.
        Either way they stay RUNNING in the store and go on at the next start."""
        self.draining = True
        runtimes = list(self._runtimes.values())
        for runtime in runtimes:
            runtime.draining = True
            runtime.events.close()
        tasks = [h.run.task for rt in runtimes for h in rt.handles.values() if h.run is not None and h.run.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for runtime in runtimes:
            await runtime.detach_runs()

    async def acknowledge(self) -> None:
        """Called before any reply leaves: what the call did is durable."""
        await self.services.store.flush()

    def _refuse_while_draining(self) -> None:
        if self.draining:
            raise FailedPrecondition("the server is shutting down; retry against its replacement", reason="SHUTTING_DOWN")

    def _remember(self, runtime: Runtime) -> None:
        self._runtimes[runtime.id] = runtime
        self._runtimes.move_to_end(runtime.id)
        if not self.services.store.durable:
            return
        while len(self._runtimes) > self.cache_size:
            idle = next((rt for rt in self._runtimes.values() if not rt.busy and rt is not runtime), None)
            if idle is None:
                return  # everything in memory is working: keep it all
            del self._runtimes[idle.id]

    @property
    def cached(self) -> int:
        return len(self._runtimes)
