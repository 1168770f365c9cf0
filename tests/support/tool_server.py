"""An HTTP endpoint the test owns: counts hits per path and keeps each Idempotency-Key; it can
hang up on a path's next requests after reading them (`cuts`), as a tool server that dies
mid-call does."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from tests.support.loopback import Loopback


@dataclass
class ToolServer(Loopback):
    hits: Counter[str] = field(default_factory=Counter)
    keys: list[str] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)
    delay: float = 0.0
    delays: dict[str, float] = field(default_factory=dict)  # per tool path
    in_flight_keys: list[str] = field(default_factory=list)
    cuts: Counter[str] = field(default_factory=Counter)  # per tool path: requests to read, then hang up on

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{name}", self._hit)

    async def _hit(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.hits[name] += 1
        key = request.headers.get("Idempotency-Key", "")
        self.keys.append(key)
        self.bodies.append(await request.text())
        if self.cuts[name] > 0:
            self.cuts[name] -= 1
            assert request.transport is not None
            request.transport.close()  # the request is read (it may have taken effect): no reply
            return web.Response(status=204)  # never reaches the client
        delay = self.delays.get(name, self.delay)
        if delay:
            self.in_flight_keys.append(key)
            try:
                await asyncio.sleep(delay)
            finally:
                self.in_flight_keys.remove(key)
        if name == "fail":
            return web.Response(status=503, text="upstream down")
        return web.Response(text=f"{name} ok #{self.hits[name]}")
