"""Time, as the domain reads it: one port, so that a test can move it by hand.

The domain never calls `time.time()`, `asyncio.sleep` or `loop.call_later` itself: journal
times, Request expiries, heartbeats, request-id lifetimes, quota windows, a run's wall-time
budget and a Wait's timeout all come from the Clock in Services. The server's is SystemClock;
tests of the domain use a clock they advance (tests/support/clock.py), so that what depends on
time is tested without waiting for it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def time(self) -> float:
        """Wall time, in seconds since the epoch: what is journaled and compared with expiries."""
        ...

    def monotonic(self) -> float:
        """Seconds that only go forward: for intervals (quota windows, rechecks)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Calls `callback` (on the event loop) after `delay` seconds, unless cancelled."""
        ...

    def deadline(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        """A block that raises TimeoutError when it runs past `seconds` (None: never)."""
        ...


class SystemClock:
    """The machine's clocks and the running event loop's timers."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)

    @contextlib.asynccontextmanager
    async def deadline(self, seconds: float | None) -> AsyncIterator[None]:
        async with asyncio.timeout(seconds):
            yield


SYSTEM_CLOCK = SystemClock()


async def wait_at_most(clock: Clock, tasks: Collection[asyncio.Future[Any]], seconds: float) -> None:
    """Until every task is done or `seconds` have passed on the clock, whichever comes first
    (a Close's grace, a shutdown's): the tasks themselves go on either way."""
    if not tasks:
        return
    with contextlib.suppress(TimeoutError):
        async with clock.deadline(seconds):
            await asyncio.wait(tasks)
