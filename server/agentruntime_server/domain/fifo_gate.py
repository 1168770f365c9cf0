"""A gate with a capacity that lets waiters in strictly in arrival order: model calls, a
handle's concurrent children, a tenant's running handles."""

from __future__ import annotations

import asyncio
from collections import deque


class FifoGate:
    """At most `capacity` holders; waiters enter strictly in arrival order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def would_wait(self) -> bool:
        return self.held >= self.capacity or bool(self._waiters)

    async def acquire(self) -> None:
        if self.held < self.capacity and not self._waiters:
            self.held += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self.held <= self.capacity and self._waiters:  # past a lowered capacity, a slot goes
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter: `held` is unchanged
                return
        self.held -= 1

    def resize(self, capacity: int) -> None:
        """A new capacity (a quota changed): raised, the waiters it makes room for go in now."""
        self.capacity = capacity
        while self.held < self.capacity and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.held += 1
                waiter.set_result(None)
