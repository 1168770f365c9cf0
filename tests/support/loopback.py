"""An aiohttp app served on a free loopback port for the length of one test."""

from __future__ import annotations

import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from aiohttp import web

R = TypeVar("R")


class Loopback:
    port: int = 0
    _runner: web.AppRunner | None = None
    tls: ssl.SSLContext | None = None  # set before start: served over https (for `localhost` and 127.0.0.1)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self, port: int = 0) -> None:
        """Serves on `port` (a free one when 0: `self.port` says which)."""
        app = web.Application()
        self.routes(app)
        # A short shutdown: a test's slow handlers must not hold up its teardown.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=self.tls)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ScriptedServer(Loopback, Generic[R]):
    """A model API fake: each model name has a script (request body -> reply), and every
    request is kept with its headers and counted per model."""

    def __init__(self) -> None:
        self.scripts: dict[str, Callable[[dict[str, Any]], R]] = {}
        self.calls: Counter[str] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    def script(self, model: str, script: Callable[[dict[str, Any]], R]) -> None:
        self.scripts[model] = script

    @property
    def base_url(self) -> str:
        return f"https://localhost:{self.port}/v1" if self.tls is not None else f"http://127.0.0.1:{self.port}/v1"

    async def receive(self, request: web.Request) -> tuple[dict[str, Any], str, Callable[[dict[str, Any]], R] | None]:
        """Records the request; returns its body, its model and that model's script (if any)."""
        body = await request.json()
        model = body["model"]
        self.calls[model] += 1
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        return body, model, self.scripts.get(model)
