"""Prometheus metrics: one registry per server, served by prometheus-client's own HTTP
server on a separate port. Updated from the event stream (turns, tokens, tool calls,
results, pending handles), from the gRPC edge (calls by method and code), and from the
model-call path (latency per attempt, retries). Every label value comes from a fixed
vocabulary or from the server's own configuration (method and provider names): never a
tenant's agent or tool name, a key or a prompt."""

from __future__ import annotations

import asyncio
import logging
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from ..domain.vocabulary import HandleState
from ..domain.watching.event_log import Event, EventKind

log = logging.getLogger(__name__)

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
MODEL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

_TURN_ENDED = EventKind.TURN_ENDED
_TOOL_CALL_ENDED = EventKind.TOOL_CALL_ENDED
_STATE_CHANGED = EventKind.STATE_CHANGED
_RESULT = EventKind.RESULT
_RUNTIME_GONE = EventKind.RUNTIME_GONE
_SUSPENDED = HandleState.SUSPENDED


class Metrics:
    """The server's metrics. `observe` is an events.Observer; `on_attempt`/`on_retry` a
    providers.base.CallMonitor; the gRPC interceptor reads `rpc_*`."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        # The names and labels of go-grpc-prometheus, so its dashboards work as they are.
        grpc_labels = ("grpc_service", "grpc_method", "grpc_type")
        self.rpc_started = Counter("grpc_server_started", "RPCs started on the server", grpc_labels, registry=registry)
        self.rpc_handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by status code (a refused call counts with its canonical code)",
            (*grpc_labels, "grpc_code"),
            registry=registry,
        )
        self.rpc_seconds = Histogram(
            "grpc_server_handling_seconds",
            "time from the request to the status (for a stream, to its end)",
            (*grpc_labels, "grpc_code"),
            buckets=RPC_BUCKETS,
            registry=registry,
        )
        self._turns = Counter("agentruntime_turns", "model round trips (turns) completed", registry=registry)
        self._tokens = Counter("agentruntime_tokens", "tokens spent by completed turns", registry=registry)
        by_kind = Counter(
            "agentruntime_tokens_by_kind",
            "tokens spent by completed turns, by the kind providers bill (reasoning is part of output)",
            ("kind",),
            registry=registry,
        )
        self._kinds = tuple(by_kind.labels(kind) for kind in ("input", "cache_read", "cache_write", "output", "reasoning"))
        self._cost = Counter(
            "agentruntime_cost_micros",
            "what completed turns cost at the prices in force, in micro-units",
            ("currency",),
            registry=registry,
        )
        self._unpriced = Counter("agentruntime_unpriced_turns", "completed turns no price covered", registry=registry)
        tool_calls = Counter(
            "agentruntime_tool_calls", "tool call results recorded (task included)", ("outcome",), registry=registry
        )
        self._tool_ok = tool_calls.labels("ok")
        self._tool_error = tool_calls.labels("error")
        self._results = Counter(
            "agentruntime_results",
            "results settled by handles (children included), by the proto's status and limit names",
            ("status", "limit"),
            registry=registry,
        )
        self._result_children: dict[tuple[object, object], Counter] = {}
        self._pending = Gauge(
            "agentruntime_pending_handles",
            "handles SUSPENDED on a pending Request (a suspended child's waiting ancestors included), "
            "counted from the suspensions this process has seen",
            registry=registry,
        )
        self._suspended: dict[str, set[str]] = {}  # runtime -> its handles counted in _pending
        model_labels = ("provider", "outcome")
        self._model_seconds = Histogram(
            "agentruntime_model_call_seconds",
            "one attempt of an HTTP model call (the exchange, not the wait for the call gate), by outcome: "
            "ok, rate_limited, server_error, timeout, unreachable, rejected, cancelled",
            model_labels,
            buckets=MODEL_BUCKETS,
            registry=registry,
        )
        self._model_children: dict[tuple[str, str], Histogram] = {}
        self._model_retries = Counter(
            "agentruntime_model_call_retries",
            "model call attempts retried after a provider fault, by the fault",
            ("provider", "reason"),
            registry=registry,
        )
        self._auth_failures = Counter(
            "agentruntime_auth_failures",
            "gRPC calls refused UNAUTHENTICATED, by method and reason: missing, malformed, invalid, revoked, "
            "expired, tenant_changed (an open stream's credential now names another tenant)",
            ("grpc_method", "reason"),
            registry=registry,
        )
        self._server: WSGIServer | None = None
        self.port = 0

    # ---- events.Observer ---------------------------------------------------------------------

    def observe(self, runtime_id: str, event: Event) -> None:
        kind = event.kind
        if kind is _TURN_ENDED:
            self._turns.inc()
            if event.tokens:
                self._tokens.inc(event.tokens)
            split = event.split
            if split is not None:
                for counter, value in zip(
                    self._kinds, (split.input, split.cache_read, split.cache_write, split.output, split.reasoning), strict=True
                ):
                    if value:
                        counter.inc(value)
            cost = event.cost
            if cost is not None:
                if not cost.priced:
                    self._unpriced.inc()
                elif cost.micros:
                    self._cost.labels(cost.currency).inc(cost.micros)
        elif kind is _TOOL_CALL_ENDED:
            (self._tool_error if event.is_error else self._tool_ok).inc()
        elif kind is _STATE_CHANGED:
            handles = self._suspended.get(runtime_id)
            if event.state is _SUSPENDED:
                if handles is None:
                    handles = self._suspended[runtime_id] = set()
                if event.handle_id not in handles:
                    handles.add(event.handle_id)
                    self._pending.inc()
            elif handles is not None and event.handle_id in handles:
                handles.remove(event.handle_id)
                if not handles:
                    del self._suspended[runtime_id]
                self._pending.dec()
        elif kind is _RUNTIME_GONE:
            # Deleted while suspended (retention) or taken over: no state change will follow here.
            self._pending.dec(len(self._suspended.pop(runtime_id, ())))
        elif kind is _RESULT and event.result is not None:
            status, limit = event.result.status, event.result.limit
            child = self._result_children.get((status, limit))
            if child is None:
                child = self._results.labels(f"STATUS_{status.name}", limit.wire_name if limit.value else "LIMIT_UNSPECIFIED")
                self._result_children[(status, limit)] = child
            child.inc()

    # ---- providers.base.CallMonitor ----------------------------------------------------------

    def on_attempt(self, provider: str, seconds: float, outcome: str) -> None:
        child = self._model_children.get((provider, outcome))
        if child is None:
            child = self._model_children[(provider, outcome)] = self._model_seconds.labels(provider, outcome)
        child.observe(seconds)

    def on_retry(self, provider: str, reason: str) -> None:
        self._model_retries.labels(provider, reason).inc()

    # ---- the gRPC edge ---------------------------------------------------------------------

    def auth_failed(self, method: str, reason: str) -> None:
        """A failed authentication (api/auth_failures.py): the method is the service's, the reason a fixed word."""
        self._auth_failures.labels(method, reason).inc()

    # ---- the /metrics endpoint -----------------------------------------------------------------

    def serve(self, listen: str) -> int:
        """Serves /metrics on `listen` (host:port) in a thread; returns the port bound.

        A port that cannot be bound is logged loudly and skipped: the service itself stays up."""
        host, port = split_listen(listen)
        try:
            server, _thread = start_http_server(port, addr=host or "0.0.0.0", registry=self.registry)
        except (OSError, OverflowError) as exc:  # taken, not an address here, or not a port
            log.error("metrics: cannot listen on %s (%s); serving without /metrics", listen, exc)
            return 0
        self._server = server
        self.port = server.server_port
        shown = f"[{host}]" if ":" in host else host or "0.0.0.0"
        log.info("Prometheus metrics on http://%s:%d/metrics", shown, self.port)
        return self.port

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            # shutdown() waits for the serving loop to notice (up to its 0.5 s poll): off the loop.
            await asyncio.to_thread(server.shutdown)
            server.server_close()


def split_listen(listen: str) -> tuple[str, int]:
    """'127.0.0.1:9464' -> ('127.0.0.1', 9464); '[::1]:9464' -> ('::1', 9464); ':9464' -> ('', 9464)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
