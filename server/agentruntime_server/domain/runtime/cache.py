"""The runtimes in this process's memory, and how one gets there. The store is the source of
truth: a runtime with nothing to keep in memory may leave it, and is loaded back when it is
next addressed. Loading is pure: the journal replayed, nothing armed, nothing run (taking a
runtime over is the service's separate step)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator

from ..errors import NotFound, OwnedElsewhere, Unavailable
from ..ports import Leases, Services
from ..tenancy.quotas import Tenancy
from .runtime import Runtime

log = logging.getLogger(__name__)


class RuntimeCache:
    def __init__(self, services: Services, size: int = 1000) -> None:
        self.services = services
        self.size = size
        self.tenancy: Tenancy | None = None  # given to every runtime it holds
        self.runtimes: OrderedDict[str, Runtime] = OrderedDict()  # least recently used first
        self.draining = False
        self._loading: dict[str, asyncio.Future[Runtime]] = {}  # key -> the load under way
        self._deleting: dict[str, asyncio.Future[None]] = {}  # key -> the store's delete under way
        self._dropping: set[asyncio.Task[None]] = set()
        self._releasing: set[asyncio.Task[None]] = set()

    @property
    def leases(self) -> Leases:
        return self.services.leases

    @property
    def cached(self) -> int:
        return len(self.runtimes)

    def pending(self, key: str) -> bool:
        """A load or a delete of the runtime is under way."""
        return key in self._loading or key in self._deleting

    async def load(self, runtime_id: str, key: str) -> Runtime:
        """The runtime as this process holds it (its lease taken if no live replica holds it;
        OwnedElsewhere if one does), loaded from the store if it is not in memory."""
        found = self.runtimes.get(key)
        if found is not None:
            await self.leases.confirm()
            found = self.runtimes.get(key)
        if found is not None:
            if self.leases.holds(key) and not found.journal.closed:
                self.runtimes.move_to_end(key)
                return found
            await self.drop(found)  # its lease was lost, or the store refused a write of it: this copy must not act again
        loading = self._loading.get(key)
        if loading is not None:  # another caller is loading it (a store whose reads await): share its copy
            return await asyncio.shield(loading)
        deleting = self._deleting.get(key)
        if deleting is not None:  # being deleted (retention: unless it was written since): as the store decides
            await asyncio.shield(deleting)
            return await self.load(runtime_id, key)
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

    async def _load(self, runtime_id: str, key: str) -> Runtime:
        """Its lease, then its journal, replayed."""
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
        if self.draining:
            runtime.draining = True
            runtime.events.close()
        self.remember(runtime)
        return runtime

    async def read(self, runtime_id: str, key: str) -> Runtime:
        """A runtime to read. Replicas read one that another replica runs, or that nobody runs,
        from the database as acknowledged, without taking its lease (nor keeping the copy);
        a process on its own store reads the copy it holds."""
        if not self.leases.shared:
            return await self.load(runtime_id, key)
        if key in self.runtimes:
            await self.leases.confirm()
        found = self.runtimes.get(key)
        if found is not None and self.leases.holds(key) and not found.journal.closed:
            return found
        stored = await self.services.store.load(key)
        if stored is None:
            raise NotFound("runtime", runtime_id, "create it with CreateRuntime first")
        return Runtime.restore(runtime_id, stored, self.services, key)

    def remember(self, runtime: Runtime) -> None:
        """Keeps the runtime in memory; past the cache's size, the least recently used idle
        one leaves (its lease given up on replicas)."""
        runtime.tenancy = self.tenancy
        self.runtimes[runtime.key] = runtime
        self.runtimes.move_to_end(runtime.key)
        if not self.services.store.durable:
            return
        while len(self.runtimes) > self.size:
            idle = next((rt for rt in self.runtimes.values() if not rt.busy and rt is not runtime), None)
            if idle is None:
                return  # everything in memory is working: keep it all
            idle.timers.release()
            del self.runtimes[idle.key]
            self.services.store.forget(idle.key)
            if self.leases.shared:
                task = asyncio.get_running_loop().create_task(self._release(idle.key))
                self._releasing.add(task)
                task.add_done_callback(self._releasing.discard)

    async def _release(self, key: str) -> None:
        with contextlib.suppress(Exception):  # a lease not given up lapses on its own
            await self.services.store.flush()
            if key not in self.runtimes and key not in self._loading:
                await self.leases.release(key)

    def lost(self, key: str) -> None:
        """The runtime's lease is gone (the store refused a write, or renewal found it taken)."""
        runtime = self.runtimes.get(key)
        if runtime is not None and not self.leases.holds(key):
            task = asyncio.get_running_loop().create_task(self.drop(runtime))
            self._dropping.add(task)
            task.add_done_callback(self._dropping.discard)

    def unwritten(self, runtime: Runtime) -> None:
        """The store did not take the runtime's last writes: the copy is ahead of its journal,
        so it writes and answers no more from now on, and stops."""
        runtime.journal.closed = True
        task = asyncio.get_running_loop().create_task(self.drop(runtime))
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    async def drops(self) -> None:
        """Waits for the copies being dropped."""
        await asyncio.gather(*self._dropping)

    async def drop(self, runtime: Runtime) -> None:
        """This copy stops at once and writes nothing more: the replica that holds the lease
        now goes on from the journal. Its watchers and waiters are told to retry."""
        runtime.journal.closed = True
        if self.runtimes.get(runtime.key) is runtime:
            del self.runtimes[runtime.key]
            log.warning("runtime %s: its lease is lost or a write failed; its copy stops (the journal goes on)", runtime.key)
        runtime.stop_timers()
        runtime.events.close()
        await runtime.runs.detach_all()

    @contextlib.asynccontextmanager
    async def deciding(self, key: str) -> AsyncIterator[None]:
        """While the store deletes the runtime (or decides not to), a load of it waits
        (`load`), so it cannot write under the delete."""
        decided = asyncio.get_running_loop().create_future()
        self._deleting[key] = decided
        try:
            yield
        finally:
            del self._deleting[key]
            decided.set_result(None)

    async def deleted(self, key: str) -> bool:
        """Waits for a delete of the runtime under way, if any; whether there was one."""
        deleting = self._deleting.get(key)
        if deleting is None:
            return False
        await asyncio.shield(deleting)
        return True
