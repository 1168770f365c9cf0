"""How long the event loop was held: the longest stretch of CPU time its thread spent between
two turns of a ticker that wakes every 5 ms. CPU time, not wall time: a loaded machine (other
processes on the same cores) stretches every wait, but not the CPU one callback spends, so a
bound on it holds on any machine, and one callback that holds the loop for seconds breaks it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator


class LoopHeld:
    def __init__(self) -> None:
        self.longest = 0.0  # seconds of the loop thread's CPU time between two ticks
        self.ticks = 0

    async def _tick(self) -> None:
        last = time.thread_time()
        while True:
            await asyncio.sleep(0.005)
            now = time.thread_time()
            self.longest = max(self.longest, now - last)
            self.ticks += 1
            last = now


@contextlib.asynccontextmanager
async def loop_held() -> AsyncIterator[LoopHeld]:
    """Measures the running loop (the test's own, which an in-process server shares) while open.

    What earlier tests left behind is collected and frozen first, as a server freezes what its
    start made (process/collector.py): a full collection of another test's garbage is not this
    measure's (one took 117 ms inside it after the hostile corpus's tests)."""
    gc.collect()
    gc.freeze()
    held = LoopHeld()
    ticker = asyncio.ensure_future(held._tick())
    try:
        yield held
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        gc.unfreeze()
