"""The one way the tests build an in-process server: `serve(**overrides)`.

Every server listens on a free loopback port, keeps its state in memory and serves no
metrics, unless a test overrides that (`store=f"sqlite:///{path}"`, `metrics_listen="127.0.0.1:0"`
for a free metrics port). No test binds the default metrics port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import RunningServer, start
from agentruntime_server.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

DEFAULTS: dict[str, Any] = {"listen": "127.0.0.1:0", "metrics_listen": "off", "store": "memory://"}


@dataclass
class Served:
    running: RunningServer
    channel: grpc.aio.Channel
    stub: pb_grpc.AgentRuntimeAsyncStub
    stopped: bool = False

    @property
    def port(self) -> int:
        return self.running.port

    async def stop(self, grace: float | None = None) -> None:
        """Stops the server now (a test of shutdown); leaving `serve` then stops nothing more."""
        self.stopped = True
        await self.running.stop(grace=grace)


def server_settings(**overrides: Any) -> Settings:
    """The test defaults, with the test's own settings over them."""
    return Settings(**{**DEFAULTS, **overrides})


@asynccontextmanager
async def serve(*, span_exporter: SpanExporter | None = None, **overrides: Any) -> AsyncIterator[Served]:
    """A real server, an open channel to it and a stub; the server stops on exit."""
    running = await start(server_settings(**overrides), span_exporter=span_exporter)
    served: Served | None = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            served = Served(running, channel, pb_grpc.AgentRuntimeStub(channel))
            yield served
    finally:
        if served is None or not served.stopped:
            await running.stop(grace=None)
