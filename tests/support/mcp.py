"""An MCP server built with the official SDK (MCPServer) on loopback, and a model that calls one
of its tools and then answers with what it got."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from tests.support.model_server import Reply, tool_results
from tests.support.poll import until


class Stats(TypedDict):
    count: int
    total: int


class Calc:
    """An MCP server with a few tools, on a loopback port, that a test can stop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.meta: list[Any] = []
        self.requests = 0  # HTTP requests of any kind
        self.hosts: set[str] = set()  # their Host headers
        server = MCPServer("calc")

        @server.tool()
        def add(a: int, b: int, ctx: Context) -> str:
            """Adds two integers."""
            self.meta.append(dict(ctx.request_context.meta or {}))
            return str(a + b)

        @server.tool()
        def shout(text: str) -> str:
            """Upper-cases text."""
            return text.upper()

        @server.tool()
        def stats(numbers: list[int]) -> Stats:
            """Counts and sums numbers."""
            return Stats(count=len(numbers), total=sum(numbers))

        # The SDK's own Host check is off: it would refuse the made-up name the rebinding tests
        # use, and what a rebound name is really aimed at (a metadata service) checks nothing.
        self.app = server.streamable_http_app(transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        if not port:
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
        self.port = port
        self.server = uvicorn.Server(
            uvicorn.Config(self._counted, host=host, port=self.port, log_level="warning", interface="asgi3")
        )
        self.task: asyncio.Task[None] | None = None

    async def _counted(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.requests += 1
            self.hosts.add(dict(scope["headers"]).get(b"host", b"").decode())
        await self.app(scope, receive, send)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    async def start(self) -> None:
        self.task = asyncio.ensure_future(self.server.serve())
        await until(lambda: self.server.started, "the MCP server to start", timeout=4)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@pytest.fixture
async def calc() -> AsyncIterator[Calc]:
    made = Calc()
    await made.start()
    yield made
    await made.stop()


def call_then_answer(tool: str, arguments: dict[str, Any]) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[(tool, arguments)], tokens=10)
        return Reply(text="done", tokens=10)

    return script
