"""Observability: Prometheus metrics on their own port, JSON logs with runtime/handle ids,
OpenTelemetry spans when an exporter is configured. The app wires it in through the seams
the rest of the server already has: event observers (domain/events.Observer), a gRPC
server interceptor, and the providers' CallMonitor hook. Nothing here is imported by the
domain; OpenTelemetry is imported only when tracing is on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from ..domain.watching.event_log import Observer
from . import logs
from .metrics import Metrics
from .rpc import ObservingInterceptor

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from ..providers.base import CallMonitor
    from ..settings import Settings
    from .tracing import Tracing

OTEL_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class _Monitors:
    """Both CallMonitors, when metrics and tracing are both on."""

    def __init__(self, *monitors: CallMonitor) -> None:
        self._monitors = monitors

    def on_attempt(self, provider: str, seconds: float, outcome: str) -> None:
        for monitor in self._monitors:
            monitor.on_attempt(provider, seconds, outcome)

    def on_retry(self, provider: str, reason: str) -> None:
        for monitor in self._monitors:
            monitor.on_retry(provider, reason)


@dataclass
class Observability:
    metrics: Metrics | None = None
    tracing: Tracing | None = None
    log_context: bool = False
    metrics_listen: str = ""
    observers: tuple[Observer, ...] = field(init=False)
    model_monitor: CallMonitor | None = field(init=False)

    def __post_init__(self) -> None:
        observers: list[Observer] = []
        monitors: list[CallMonitor] = []
        if self.metrics is not None:
            observers.append(self.metrics.observe)
            monitors.append(self.metrics)
        if self.tracing is not None:
            observers.append(self.tracing.observe)
            monitors.append(self.tracing)
        if self.log_context:
            observers.append(logs.observe)
        self.observers = tuple(observers)
        self.model_monitor = monitors[0] if len(monitors) == 1 else _Monitors(*monitors) if monitors else None

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if self.metrics is None and self.tracing is None and not self.log_context:
            return []
        return [ObservingInterceptor(self.metrics, self.tracing, self.log_context)]

    @property
    def metrics_port(self) -> int:
        """The port /metrics is served on (0: not served)."""
        return self.metrics.port if self.metrics is not None else 0

    def start(self) -> None:
        if self.metrics is not None and self.metrics_listen:
            self.metrics.serve(self.metrics_listen)

    async def stop(self) -> None:
        if self.metrics is not None:
            await self.metrics.close()
        if self.tracing is not None:
            await self.tracing.close()


def tracing_endpoint(settings: Settings, environ: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP endpoint to export to ('' when only the standard variables name one); None: tracing off."""
    if settings.otel_endpoint:
        return settings.otel_endpoint
    return "" if any(environ.get(name) for name in OTEL_ENDPOINT_VARIABLES) else None


def build(settings: Settings, span_exporter: SpanExporter | None = None) -> Observability:
    """What the settings turn on. `span_exporter` (tests) turns tracing on with that exporter."""
    metrics_on = settings.metrics_listen not in ("", "off")
    tracing = None
    endpoint = tracing_endpoint(settings)
    if span_exporter is not None or endpoint is not None:
        from . import tracing as otel

        tracing = otel.build(endpoint or "", span_exporter)
    return Observability(
        metrics=Metrics() if metrics_on else None,
        tracing=tracing,
        log_context=settings.log_format == "json",
        metrics_listen=settings.metrics_listen if metrics_on else "",
    )
