"""A clock a test moves by hand (the domain's Clock port, domain/clock.py), after Temporal's
time-skipping test server: nothing waits for real time, and what depends on time (a heartbeat,
a Request's expiry, a run's wall-time budget, a Wait's timeout, a quota's window, a request id's
lifetime, a retry's pause) happens when the test says the time has come.

`advance(seconds)` moves both clocks forward and fires, in order, every timer and sleeper due on
the way, letting the event loop run what each one starts before it goes on."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable

START = 1_800_000_000.0  # 2027-01-15: a wall time no test reads as now by mistake
SETTLE_ROUNDS = 50  # loop iterations given to what a fired timer starts, before time moves on


class FakeTimer:
    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self, start: float = START) -> None:
        self._wall = start
        self._elapsed = 0.0  # the monotonic clock: seconds since the clock was made
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()

    # ---- the Clock port ------------------------------------------------------------------

    def time(self) -> float:
        return self._wall + self._elapsed

    def monotonic(self) -> float:
        return self._elapsed

    def call_later(self, delay: float, callback: Callable[[], object]) -> FakeTimer:
        timer = FakeTimer(self._elapsed + max(delay, 0.0), callback)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await woken
        finally:
            timer.cancel()

    @contextlib.asynccontextmanager
    async def deadline(self, seconds: float | None) -> AsyncIterator[None]:
        if seconds is None:
            yield
            return
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as timeout:
            if seconds <= 0:  # due already, as asyncio.timeout(0) is: no time has to pass
                timeout.reschedule(loop.time())
            # Due: the block's own asyncio timeout is moved to now, so it raises TimeoutError
            # in the block's task at its next step, as a real deadline would (at once for none left).
            if seconds <= 0:
                timeout.reschedule(loop.time())
            timer = self.call_later(seconds, lambda: timeout.reschedule(loop.time()))
            try:
                yield
            finally:
                timer.cancel()

    # ---- the test's hand ------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Timers and sleepers not yet due (cancelled ones left out)."""
        return sum(1 for _, _, timer in self._timers if not timer.cancelled)

    async def settle(self) -> None:
        """Lets the event loop run what is ready (and what that makes ready), time standing still."""
        for _ in range(SETTLE_ROUNDS):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Moves time `seconds` forward, firing every timer due on the way at its own time."""
        until = self._elapsed + seconds
        await self.settle()
        while self._timers and self._timers[0][0] <= until:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._elapsed = max(self._elapsed, when)
            timer.callback()
            await self.settle()
        self._elapsed = until
        await self.settle()
