from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Polls a condition the test cannot await directly (state in another process or server)."""
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def eventually(check: Callable[[], Awaitable[object]], what: str, timeout: float = 10.0) -> None:
    """`until` for a condition only a call can read (an RPC: Inspect, List, a query)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
