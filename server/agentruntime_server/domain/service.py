"""All runtimes served by one process."""

from __future__ import annotations

import uuid

from .errors import AlreadyExists, NotFound
from .model import AgentSpec
from .runtime import Runtime, Services
from .validation import check_agents, check_runtime_id


class RuntimeService:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._runtimes: dict[str, Runtime] = {}

    async def create_runtime(self, runtime_id: str, agents: tuple[AgentSpec, ...]) -> Runtime:
        if runtime_id:
            check_runtime_id(runtime_id)
        else:
            runtime_id = f"rt-{uuid.uuid4().hex[:16]}"
        check_agents(agents)
        if runtime_id in self._runtimes:
            raise AlreadyExists(f"runtime {runtime_id!r} already exists; choose another id or leave it empty")
        runtime = Runtime(runtime_id, agents, self.services)
        self._runtimes[runtime_id] = runtime
        await self.services.store.create_runtime(runtime_id, agents)
        return runtime

    def runtime(self, runtime_id: str) -> Runtime:
        found = self._runtimes.get(runtime_id)
        if found is None:
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        return found
