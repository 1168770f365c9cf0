"""Who executes a runtime. A process on a store of its own executes all of them (SoleOwner);
replicas sharing a database take a lease per runtime (ports.Leases; store/postgres/leases.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """The outcome of asking to execute a runtime."""

    owned: bool  # this process holds the lease now
    exists: bool = True  # False: no such runtime in the store
    address: str = ""  # not owned: where the replica that holds it serves


class SoleOwner:
    """The only process on its store: it owns every runtime, for good."""

    shared = False

    async def claim(self, runtime_id: str) -> Claim:
        return Claim(owned=True)

    async def start(self) -> None:
        pass

    async def confirm(self) -> None:
        pass

    def holds(self, runtime_id: str) -> bool:
        return True

    async def release(self, runtime_id: str) -> None:
        pass

    async def release_all(self) -> None:
        pass

    async def renew(self) -> list[str]:
        return []

    async def orphans(self) -> list[str]:
        return []

    def on_lost(self, callback: Callable[[str], None]) -> None:
        pass
