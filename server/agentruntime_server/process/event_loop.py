"""The event loop the server runs on: uvloop (libuv) unless AGENTRUNTIME_EVENT_LOOP says
`asyncio` (the standard library's, for its debug mode and tools).

Measured under the bench workload (C = 20, no model latency, 8 alternating runs): uvloop
takes 7 % off the server's CPU per model turn (220 against 236 µs), all of it in the loop's
own scheduling and socket work (docs/performance.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

EventLoopKind = Literal["uvloop", "asyncio"]
DEFAULT_LOOP: EventLoopKind = "uvloop"
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(kind: EventLoopKind) -> LoopFactory:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def running_loop_kind() -> EventLoopKind:
    """What the running loop is (the start-up log says it)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
