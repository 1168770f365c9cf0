"""Wires the parts together and serves them over gRPC."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from .api.auth import Authenticator, build_authenticator
from .api.servicer import AgentRuntimeServicer, add_to_server
from .api.tls import refuse_insecure, transport
from .domain.limits import Limits
from .domain.ports import Services, Store
from .domain.quotas import Quotas
from .domain.service import RuntimeService
from .http_session import HttpSession
from .observability import Observability
from .observability import build as build_observability
from .providers.base import HttpProvider
from .providers.registry import build_router
from .settings import Settings
from .store.memory import MemoryStore
from .store.sqlite import SqliteStore
from .store.urls import redacted
from .tools.egress import EgressPolicy
from .tools.http import HttpTools

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("agentruntime")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AgentRuntime"].full_name


class ListingHealthServicer(HealthServicer):  # type: ignore[misc]
    """The standard health service, with the List method its proto declares (reflection
    advertises it; the library's servicer leaves it unimplemented and logs a traceback)."""

    async def List(self, request: health_pb2.HealthListRequest, context: object) -> health_pb2.HealthListResponse:
        response = health_pb2.HealthListResponse()
        for service, status in sorted(self._server_status.items()):
            response.statuses[service].status = status
        return response


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    http: HttpSession
    tools: HttpTools
    health: HealthServicer
    service: RuntimeService
    store: Store
    observability: Observability = field(default_factory=Observability)
    retention: asyncio.Future[None] | None = None  # the task that deletes idle runtimes

    @property
    def metrics_port(self) -> int:
        """The port Prometheus /metrics is served on (0: not served)."""
        return self.observability.metrics_port

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stop accepting, let running turns reach a journal point within `grace`, close the store."""
        if self.retention is not None:
            self.retention.cancel()
            await asyncio.gather(self.retention, return_exceptions=True)
        await self.health.enter_graceful_shutdown()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await self.service.drain(grace or 0.0)
        await stopping
        await self.http.close()
        await self.tools.close()
        await self.store.close()
        await self.observability.stop()


async def _retain(service: RuntimeService, retention: float) -> None:
    """AGENTRUNTIME_RETENTION: runtimes idle longer than it are deleted, checked every minute
    (or every tenth of the retention, if that is shorter)."""
    while True:
        await asyncio.sleep(min(60.0, max(retention / 10, 0.5)))
        try:
            await service.delete_idle(retention)
        except Exception:  # a store error must not end retention for good
            log.exception("retention failed")


def open_store(url: str) -> Store:
    if url == "memory://":
        return MemoryStore()
    if url.startswith(("postgresql://", "postgres://")):
        from .store.postgres import PostgresStore  # asyncpg: ~14 MB, only for a PostgreSQL store

        return PostgresStore(url)
    return SqliteStore(url.removeprefix("sqlite:///"))


def build_service(
    settings: Settings,
    http: HttpSession,
    tools: HttpTools,
    store: Store,
    observability: Observability,
    authenticator: Authenticator,
) -> RuntimeService:
    models = build_router(settings, http)
    for provider in models.providers.values():
        if isinstance(provider, HttpProvider):
            provider.monitor = observability.model_monitor
    services = Services(
        models=models,
        http_tools=tools,
        store=store,
        inbox_capacity=settings.inbox_capacity,
        quotas=Quotas(
            runtimes=settings.quota_runtimes,
            running_handles=settings.quota_running_handles,
            tokens_per_day=settings.quota_tokens_per_day,
        ),
        limits=Limits(
            max_text_bytes=settings.max_text_bytes,
            max_inbox_bytes=settings.max_inbox_bytes,
            max_handles=settings.max_handles,
            max_concurrent_model_calls=settings.max_concurrent_model_calls,
        ),
        watch_buffer=settings.watch_buffer,
        observers=observability.observers,
    )
    return RuntimeService(services, cache_size=settings.runtime_cache, quotas_for=authenticator.quotas_for)


async def start(settings: Settings, *, span_exporter: SpanExporter | None = None) -> RunningServer:
    """Serves until stopped. `span_exporter` (tests) receives every span, as an OTLP collector would.
    A configuration that cannot serve (a bad TLS or auth file, an insecure exposure) raises
    StartupError before anything is opened."""
    secure = transport(settings)  # reads the TLS files
    refuse_insecure(settings, secure)
    authenticator = build_authenticator(settings)  # reads the tokens file or the JWKS file
    observability = build_observability(settings, span_exporter)
    http = HttpSession(settings.http_pool_size, settings.max_model_reply_bytes)
    tools = HttpTools(
        EgressPolicy(settings.tool_egress_allow, settings.tool_egress_deny),
        pool_size=settings.http_pool_size,
        max_text_bytes=settings.max_text_bytes,
    )
    store = open_store(settings.store)
    service = build_service(settings, http, tools, store, observability, authenticator)
    observability.start()  # before recovery: the runs it continues are counted
    await service.recover()
    retention = asyncio.ensure_future(_retain(service, settings.retention)) if settings.retention else None
    limits = [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
    ]
    server = grpc.aio.server(interceptors=observability.interceptors() or None, options=limits)
    add_to_server(AgentRuntimeServicer(service, settings.max_message_bytes, authenticator), server)
    health = ListingHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    if secure.credentials is None:
        port = server.add_insecure_port(settings.listen)
    else:
        port = server.add_secure_port(settings.listen, secure.credentials)
    await server.start()
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "agentruntime serving on port %d (default provider: %s, store: %s, transport: %s, auth: %s)",
        port,
        settings.default_name,
        redacted(settings.store),  # a PostgreSQL URL's password is a secret
        secure.mode,
        authenticator.mode,
    )
    return RunningServer(
        server=server,
        port=port,
        http=http,
        tools=tools,
        health=health,
        service=service,
        store=store,
        observability=observability,
        retention=retention,
    )
