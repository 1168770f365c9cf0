"""Wires the parts together and serves them over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import shutil
import sqlite3
import urllib.parse
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from .api.auth import build_authenticator
from .api.forward import Forwarder
from .api.principals import Authenticator
from .api.servicer import AgentRuntimeServicer, add_to_server
from .api.tls import read_pem, refuse_insecure, transport
from .domain.errors import StoreBroken, StoreUnavailable
from .domain.limits import Limits, Quotas
from .domain.ownership import SoleOwner
from .domain.ports import Leases, NoPrices, PriceSource, Services, Store
from .domain.runtime.service import RuntimeService
from .http import HttpClient
from .http.proxy import Proxies
from .observability import Observability
from .observability import build as build_observability
from .prices_file import PriceWatch, open_prices
from .process.event_loop import running_loop_kind
from .process.schema_judges import SchemaJudges
from .providers.base import HttpProvider
from .providers.registry import build_router
from .settings import Settings, StartupError
from .store.memory import MemoryStore
from .store.sqlite import SqliteStore, disk_full
from .store.sqlite.migrations import SchemaTooNew
from .store.urls import redacted
from .tools.egress import EgressPolicy
from .tools.http import HttpTools
from .tools.mcp import McpTools
from .tools.workers import WorkerPool

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("agentruntime")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AgentRuntime"].full_name


class ListingHealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
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
    http: HttpClient  # model calls
    tools: HttpTools
    health: health_aio.HealthServicer
    service: RuntimeService
    store: Store
    observability: Observability = field(default_factory=Observability)
    retention: asyncio.Future[None] | None = None  # the task that deletes idle runtimes
    upkeep: asyncio.Future[None] | None = None  # replicas: the task that renews and takes over leases
    forwarder: Forwarder | None = None
    workers: WorkerPool | None = None  # hosts serving worker tools
    prices: PriceWatch | None = None  # AGENTRUNTIME_PRICES, re-read when it changes
    judges: SchemaJudges | None = None  # schema checks off the event loop

    @property
    def metrics_port(self) -> int:
        """The port Prometheus /metrics is served on (0: not served)."""
        return self.observability.metrics_port

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stop accepting, let running turns reach a journal point within `grace`, close the store."""
        for task in (self.retention, self.upkeep):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.health.enter_graceful_shutdown()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await self.service.drain(grace or 0.0)  # replicas: its leases are given up here
        if self.workers is not None:
            self.workers.close()  # its hosts reconnect to another server, not wait out the grace
        await stopping
        if self.forwarder is not None:
            await self.forwarder.close()
        await self.http.close()
        await self.tools.close()
        await self.store.close()
        await self.observability.stop()
        if self.prices is not None:
            await self.prices.stop()
        if self.judges is not None:
            await self.judges.close()


def _health_follows_store(store: Store, health: health_aio.HealthServicer) -> None:
    """While the store can take no writes, health checks say NOT_SERVING, so that a load
    balancer sends callers elsewhere: PostgreSQL until its database is back, SQLite until a
    write goes through again once one failed for want of space (SERVING again then; any other
    failed commit: until the server is restarted). A server shutting
    down stays NOT_SERVING (the health service ignores sets after its graceful shutdown)."""
    loop = asyncio.get_running_loop()
    setting: set[asyncio.Task[None]] = set()

    def follow(serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in (SERVICE_NAME, ""):
            task = loop.create_task(health.set(service, status))
            setting.add(task)
            task.add_done_callback(setting.discard)

    store.on_health(follow)


async def _retain(service: RuntimeService, retention: float, suspended_retention: float) -> None:
    """AGENTRUNTIME_RETENTION and AGENTRUNTIME_SUSPENDED_RETENTION: runtimes idle longer than
    them are deleted, checked every minute (or every tenth of the shorter one, if less)."""
    shortest = min(seconds for seconds in (retention, suspended_retention) if seconds)
    while True:
        await asyncio.sleep(min(60.0, max(shortest / 10, 0.5)))
        try:
            await service.delete_idle(retention, suspended_retention)
        except StoreUnavailable:  # logged by the store as it went away; the next round tries again
            pass
        except Exception:  # a store error must not end retention for good
            log.exception("retention failed")


async def _keep_leases(service: RuntimeService, every: float) -> None:
    """Replicas: renew this process's leases, and take over those of replicas that died."""
    while True:
        await asyncio.sleep(every)
        try:
            await service.keep_leases()
        except StoreUnavailable:  # logged by the store as it went away; it says when it is back
            log.debug("lease upkeep waits for the store")
        except Exception:  # the database may be back at the next round
            log.exception("lease upkeep failed")


def advertised(settings: Settings, port: int) -> str:
    """Where other replicas reach this one: AGENTRUNTIME_ADVERTISE, else the bound address."""
    if settings.advertise:
        return settings.advertise
    host = settings.listen.rpartition(":")[0]
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"{host}:{port}"


def forwarding_credentials(settings: Settings, secure: bool) -> grpc.ChannelCredentials | None:
    """How a replica calls another: as the server is served (TLS: verified with
    AGENTRUNTIME_REPLICA_CA, presenting its own certificate when clients must)."""
    if not secure:
        return None
    roots = read_pem(settings.replica_ca, "AGENTRUNTIME_REPLICA_CA") if settings.replica_ca else None
    if settings.tls_client_ca:
        return grpc.ssl_channel_credentials(
            roots,
            read_pem(settings.tls_key, "AGENTRUNTIME_TLS_KEY"),
            read_pem(settings.tls_cert, "AGENTRUNTIME_TLS_CERT"),
        )
    return grpc.ssl_channel_credentials(roots)


def open_store(url: str) -> Store:
    if url == "memory://":
        return MemoryStore()
    if url.startswith(("postgresql://", "postgres://")):
        from .store.postgres import PostgresStore  # asyncpg: ~14 MB, only for a PostgreSQL store

        return PostgresStore(url)
    return SqliteStore(url.removeprefix("sqlite:///"))


def model_proxies() -> Proxies:
    """HTTPS_PROXY, HTTP_PROXY and NO_PROXY, for model calls only (http tools and MCP servers
    connect directly: their egress policy checks the addresses they reach)."""
    try:
        return Proxies.from_environment()
    except ValueError as error:
        raise StartupError(str(error)) from None


def _opened_sqlite(url: str) -> Store:
    try:
        return open_store(url)
    except (OSError, sqlite3.Error, SchemaTooNew) as error:
        path = url.removeprefix("sqlite:///")
        directory = Path(path).absolute().parent
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or (
            isinstance(error, sqlite3.Error) and disk_full(error, directory)
        ):
            free = shutil.disk_usage(directory).free
            raise StartupError(
                f"AGENTRUNTIME_STORE: cannot open the SQLite store {path}: its disk is full ({free // 1024} KiB free);"
                " free some space and start again"
            ) from None
        raise StartupError(f"AGENTRUNTIME_STORE: cannot open the SQLite store {path}: {error}") from None


async def opened_store(url: str) -> Store:
    """open_store, connected (a PostgreSQL store connects on first use): a store that cannot
    be opened stops the start with StartupError, one line naming where it is, never a password."""
    if not url.startswith(("postgresql://", "postgres://")):
        return _opened_sqlite(url)
    import asyncpg  # type: ignore[import-untyped]

    from .store.postgres import PostgresStore
    from .store.postgres.migrations import SchemaTooNew as PgSchemaTooNew

    store = PostgresStore(url)
    try:
        await store.connect()
    except ValueError:  # asyncpg's parse: its message may quote a piece of a password it cut wrong
        raise StartupError(
            "AGENTRUNTIME_STORE: not a valid PostgreSQL URL"
            " (percent-encode any '@', ':', '/', '?' or '#' in the user name or the password)"
        ) from None
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, PgSchemaTooNew) as error:
        where = _where(url)
        reason = _without(str(error).splitlines()[0] if str(error) else "", url)
        problem = f"{type(error).__name__}: {reason}" if reason else type(error).__name__  # a timeout says nothing
        raise StartupError(
            f"AGENTRUNTIME_STORE: cannot use the PostgreSQL store at {where} ({problem});"
            " check the URL, and that the database is up and reachable from here"
        ) from None
    return store


def _where(url: str) -> str:
    """The host (and port) of a PostgreSQL URL that parsed: in its authority, or its query
    (`?host=/socket/dir`); never its user part."""
    parts = urllib.parse.urlsplit(url)
    where = parts.netloc.rpartition("@")[2]
    if not where:
        query = dict(urllib.parse.parse_qsl(parts.query))
        where = query.get("host", "") + (f":{query['port']}" if query.get("port") else "")
    return where or "localhost"


def _without(text: str, url: str) -> str:
    """`text` with the URL's password, if it quotes it, masked."""
    password = urllib.parse.urlsplit(url).password
    for secret in {password, urllib.parse.unquote(password)} if password else ():
        text = text.replace(secret, "***")
    return text[:300]


def build_service(
    settings: Settings,
    http: HttpClient,
    tools: HttpTools,
    store: Store,
    observability: Observability,
    authenticator: Authenticator,
    leases: Leases | None = None,
    workers: WorkerPool | None = None,
    prices: PriceSource | None = None,
    judges: SchemaJudges | None = None,
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
        quotas=Quotas(**{quota.name: settings.quota(quota.name) for quota in fields(Quotas)}),
        limits=Limits(
            max_text_bytes=settings.max_text_bytes,
            max_inbox_bytes=settings.max_inbox_bytes,
            max_handles=settings.max_handles,
            request_id_ttl=settings.request_id_ttl,
            request_ids_kept=settings.request_ids_kept,
            max_concurrent_model_calls=settings.max_concurrent_model_calls,
        ),
        watch_buffer=settings.watch_buffer,
        stream_always=settings.stream_replies == "always",
        observers=observability.observers,
        leases=leases or SoleOwner(),
        workers=workers or WorkerPool(),
        mcp=McpTools(tools.policy, settings.max_text_bytes),
        egress=tools.policy,
        prices=prices or NoPrices(),
        schema_judge=judges or SchemaJudges(settings.schema_check_workers, settings.schema_check_seconds),
    )
    quotas = ", ".join(f"{name.replace('_', ' ')} {value or 'none'}" for name, value in vars(services.quotas).items())
    log.info("quotas per tenant (the tokens file may set a tenant's own): %s", quotas)
    return RuntimeService(services, cache_size=settings.runtime_cache, quotas_for=authenticator.quotas_for)


def egress_policy(settings: Settings) -> EgressPolicy:
    """One policy for every connection a definition makes: http tools, MCP servers, and the
    URLs CreateRuntime checks. A server with authentication is shared: its own network is closed."""
    return EgressPolicy(settings.tool_egress_allow, settings.tool_egress_deny, shared=settings.auth != "none")


async def start(settings: Settings, *, span_exporter: SpanExporter | None = None) -> RunningServer:
    """Serves until stopped. `span_exporter` (tests) receives every span, as an OTLP collector would.
    A configuration that cannot serve (a bad TLS or auth file, an insecure exposure) raises
    StartupError before anything is opened; so does a store that cannot be opened."""
    secure = transport(settings)  # reads the TLS files
    refuse_insecure(settings, secure)
    authenticator = build_authenticator(settings)  # reads the tokens file or the JWKS file
    prices = open_prices(settings.prices)  # reads the price table
    store = await opened_store(settings.store)
    observability = build_observability(settings, span_exporter)
    http = HttpClient(settings.http_pool_size, proxies=model_proxies())
    tools = HttpTools(
        egress_policy(settings),
        pool_size=settings.http_pool_size,
        max_text_bytes=settings.max_text_bytes,
    )
    limits = [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
    ]
    # Replicas ping the replicas they forward to (a paused or unplugged owner is noticed within
    # a lease, not at the caller's deadline); the server takes such pings from any client.
    ping_ms = max(1000, int(settings.lease_duration * 1000 / 3))
    pings = [("grpc.http2.min_recv_ping_interval_without_data_ms", 1000), ("grpc.http2.max_ping_strikes", 0)]
    server = grpc.aio.server(interceptors=observability.interceptors() or None, options=[*limits, *pings])
    # Bound before recovery: a replica advertises its port with its first lease.
    if secure.credentials is None:
        port = server.add_insecure_port(settings.listen)
    else:
        port = server.add_secure_port(settings.listen, secure.credentials)
    leases: Leases | None = None
    forwarder: Forwarder | None = None
    if store.__class__.__name__ == "PostgresStore":  # replicas may share it: run under leases
        from .store.postgres import PostgresLeases, PostgresStore

        assert isinstance(store, PostgresStore)
        leasing = PostgresLeases(store, advertised(settings, port), settings.lease_duration)
        leases = leasing
        keepalive = [
            ("grpc.keepalive_time_ms", ping_ms),
            ("grpc.keepalive_timeout_ms", ping_ms),
            ("grpc.http2.max_pings_without_data", 0),
            # A connection attempt to a paused replica gives up as fast (gRPC's default: 20 s).
            ("grpc.min_reconnect_backoff_ms", ping_ms),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", ping_ms),
        ]
        credentials = forwarding_credentials(settings, secure.credentials is not None)
        forwarder = Forwarder(credentials, [*limits, *keepalive], leasing.replica_id)
    workers = WorkerPool()
    judges = SchemaJudges(settings.schema_check_workers, settings.schema_check_seconds)
    service = build_service(settings, http, tools, store, observability, authenticator, leases, workers, prices, judges)
    prices.start()
    # SERVING is set now (nobody asks until the server starts) and the store watched from here:
    # a commit that fails while leases are taken or runs recovered makes it NOT_SERVING too.
    health = ListingHealthServicer()
    for name in (SERVICE_NAME, ""):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    _health_follows_store(store, health)
    if leases is not None:  # replicas: live from here on
        await leases.start()
    observability.start()  # before recovery: the runs it continues are counted
    await service.recover()
    # What recovery journaled (a call in doubt, say) is committed before the server answers:
    # a store that breaks on it is NOT_SERVING from the first health check, not a tick later.
    with contextlib.suppress(StoreUnavailable, StoreBroken):  # told to health by the store's callback
        await store.flush()
    retention = None
    if settings.retention or settings.suspended_retention:
        retention = asyncio.ensure_future(_retain(service, settings.retention, settings.suspended_retention))
    upkeep = asyncio.ensure_future(_keep_leases(service, settings.lease_duration / 3)) if leases else None
    servicer = AgentRuntimeServicer(
        service,
        settings.max_message_bytes,
        authenticator,
        forwarder,
        retry_for=3 * settings.lease_duration,
        workers=workers,
        max_text_bytes=settings.max_text_bytes,
        kill_after_commit=frozenset(settings.test_kill_after_commit),
        count_auth_failure=observability.metrics.auth_failed if observability.metrics is not None else None,
    )
    add_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    await server.start()
    log.info(
        "agentruntime serving on port %d (default provider: %s, store: %s, transport: %s, auth: %s, event loop: %s)",
        port,
        settings.default_name,
        redacted(settings.store),  # a PostgreSQL URL's password is a secret
        secure.mode,
        authenticator.mode,
        running_loop_kind(),
    )
    log.info("%s", tools.policy.describe())
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
        upkeep=upkeep,
        forwarder=forwarder,
        workers=workers,
        prices=prices,
        judges=judges,
    )
