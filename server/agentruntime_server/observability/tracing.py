"""OpenTelemetry spans, only when an exporter is configured (this module is not imported
otherwise, so tracing off costs nothing).

- RPC spans (SERVER), from the gRPC interceptor, continuing a caller's `traceparent`.
- Turn and tool-call spans, built from the event pairs TURN_STARTED -> TURN_ENDED and
  TOOL_CALL_STARTED -> TOOL_CALL_ENDED with the events' times. Observers run in the task
  that emits the event, so a span opened by an event becomes the parent (through a context
  variable) of what that task does next: a turn's model calls, and the runs of the child
  handles a `task` call starts. A run's first turn hangs under the RPC that started it
  (Wake, Resume), or is a root span (recovery at start).
- Model-call spans (CLIENT), one per HTTP attempt, from the providers' CallMonitor hook;
  a retry is an event on the turn's span.

Attributes are ids, names, counts and outcomes: never arguments, outputs, prompts or keys.
Open spans are bounded: a handle that leaves RUNNING ends its open spans, and past
MAX_OPEN handles with open spans the oldest are ended."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from ..domain.vocabulary import HandleState
from ..domain.watching.event_log import Event, EventKind

log = logging.getLogger(__name__)

MAX_OPEN = 10_000  # handles with an open turn or tool-call span
# Server span status per the RPC semantic conventions: only these codes are the server's fault.
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)

# The innermost open turn or tool-call span of the current task (see the module doc).
_current: contextvars.ContextVar[Span | None] = contextvars.ContextVar("agentruntime_span", default=None)

_TURN_STARTED = EventKind.TURN_STARTED
_TURN_ENDED = EventKind.TURN_ENDED
_TOOL_CALL_STARTED = EventKind.TOOL_CALL_STARTED
_TOOL_CALL_ENDED = EventKind.TOOL_CALL_ENDED
_STATE_CHANGED = EventKind.STATE_CHANGED
_RUNNING = HandleState.RUNNING


class _Open:
    __slots__ = ("previous", "span")

    def __init__(self, span: Span, previous: Span | None) -> None:
        self.span = span
        self.previous = previous


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class Tracing:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("agentruntime_server", _version())
        self._turns: dict[tuple[str, str], _Open] = {}
        self._tools: dict[tuple[str, str], dict[str, _Open]] = {}

    # ---- RPCs (called by the interceptor) ------------------------------------------------------

    def start_rpc(
        self, service: str, method: str, metadata: Iterable[tuple[str, Any]] | None, runtime_id: str, handle_id: str
    ) -> Span:
        carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
        attributes: dict[str, str | int] = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        if runtime_id:
            attributes["agentruntime.runtime_id"] = runtime_id
        if handle_id:
            attributes["agentruntime.handle_id"] = handle_id
        return self.tracer.start_span(
            f"{service}/{method}", context=propagate.extract(carrier), kind=SpanKind.SERVER, attributes=attributes
        )

    @staticmethod
    def activate(span: Span) -> object:
        return otel_context.attach(trace.set_span_in_context(span))

    @staticmethod
    def deactivate(token: object) -> None:
        otel_context.detach(token)  # type: ignore[arg-type]

    @staticmethod
    def end_rpc(span: Span, code: grpc.StatusCode) -> None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code in SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, code.name))
        span.end()

    # ---- events.Observer -------------------------------------------------------------------------

    def observe(self, runtime_id: str, event: Event) -> None:
        try:
            self._observe(runtime_id, event)
        except Exception:  # an observer must not raise into the runtime; a lost span is not worth a run
            log.exception("tracing: event %s of %s/%s not traced", event.kind.name, runtime_id, event.handle_id)

    def _observe(self, runtime_id: str, event: Event) -> None:
        kind = event.kind
        if kind is _TURN_STARTED:
            self._start_turn(runtime_id, event)
        elif kind is _TURN_ENDED:
            self._end_turn(runtime_id, event)
        elif kind is _TOOL_CALL_STARTED:
            self._start_tool(runtime_id, event)
        elif kind is _TOOL_CALL_ENDED:
            self._end_tool(runtime_id, event)
        elif kind is _STATE_CHANGED and event.state is not _RUNNING:
            self._close_handle((runtime_id, event.handle_id), event.state.name if event.state else "?", _ns(event.time))

    def _start(self, name: str, runtime_id: str, event: Event, attributes: dict[str, str | int]) -> _Open:
        parent = _current.get()
        attributes["agentruntime.runtime_id"] = runtime_id
        attributes["agentruntime.handle_id"] = event.handle_id
        span = self.tracer.start_span(
            name,
            context=trace.set_span_in_context(parent) if parent is not None else None,
            start_time=_ns(event.time),
            attributes=attributes,
        )
        _current.set(span)
        return _Open(span, parent)

    @staticmethod
    def _finish(entry: _Open, end_time: int) -> None:
        entry.span.end(end_time=end_time)
        if _current.get() is entry.span:
            _current.set(entry.previous)

    def _start_turn(self, runtime_id: str, event: Event) -> None:
        key = (runtime_id, event.handle_id)
        stale = self._turns.pop(key, None)
        if stale is not None:
            _abandon(stale.span, "superseded", _ns(event.time))
        self._turns[key] = self._start("agentruntime.turn", runtime_id, event, {"agentruntime.turn": event.turn})
        if len(self._turns) > MAX_OPEN:
            oldest = next(iter(self._turns))
            _abandon(self._turns.pop(oldest).span, "dropped", _ns(event.time))

    def _end_turn(self, runtime_id: str, event: Event) -> None:
        entry = self._turns.pop((runtime_id, event.handle_id), None)
        if entry is None:
            return
        span = entry.span
        span.set_attribute("agentruntime.tokens", event.tokens)
        span.set_attribute("agentruntime.own_tokens", event.own_tokens)
        span.set_attribute("agentruntime.total_tokens", event.total_tokens)
        span.set_attribute("agentruntime.tool_calls", event.tool_calls)
        self._finish(entry, _ns(event.time))

    def _start_tool(self, runtime_id: str, event: Event) -> None:
        call = event.call
        if call is None:
            return
        key = (runtime_id, event.handle_id)
        calls = self._tools.get(key)
        if calls is None:
            calls = self._tools[key] = {}
            if len(self._tools) > MAX_OPEN:
                oldest = next(iter(self._tools))
                for stale in self._tools.pop(oldest).values():
                    _abandon(stale.span, "dropped", _ns(event.time))
        attributes: dict[str, str | int] = {"gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id}
        calls[call.id] = self._start("agentruntime.tool_call", runtime_id, event, attributes)

    def _end_tool(self, runtime_id: str, event: Event) -> None:
        key = (runtime_id, event.handle_id)
        calls = self._tools.get(key)
        entry = calls.pop(event.call_id, None) if calls is not None else None
        if entry is None:
            return  # a relay call (it never started here), or one whose span was already ended
        if not calls:
            del self._tools[key]
        if event.is_error:
            entry.span.set_status(Status(StatusCode.ERROR, "the tool result is an error"))
        self._finish(entry, _ns(event.time))

    def _close_handle(self, key: tuple[str, str], state: str, end_time: int) -> None:
        """The handle left RUNNING (settled, suspended, interrupted): its open spans end now."""
        turn = self._turns.pop(key, None)
        if turn is not None:
            _abandon(turn.span, state, end_time)
        for entry in (self._tools.pop(key, None) or {}).values():
            entry.span.set_attribute("agentruntime.ended_by", state)
            entry.span.end(end_time=end_time)

    # ---- providers.base.CallMonitor -------------------------------------------------------------

    def on_attempt(self, provider: str, seconds: float, outcome: str) -> None:
        end = time.time_ns()
        parent = _current.get()
        span = self.tracer.start_span(
            "agentruntime.model_call",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=SpanKind.CLIENT,
            start_time=end - _ns(seconds),
            attributes={"gen_ai.operation.name": "chat", "agentruntime.provider": provider, "agentruntime.outcome": outcome},
        )
        if outcome != "ok":
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end(end_time=end)

    def on_retry(self, provider: str, reason: str) -> None:
        parent = _current.get()
        if parent is not None:
            parent.add_event("agentruntime.model_call.retry", {"agentruntime.provider": provider, "agentruntime.reason": reason})

    async def close(self) -> None:
        # Flushes what is batched; a collector that does not answer costs at most its export timeout.
        await asyncio.to_thread(self.provider.shutdown)


def _abandon(span: Span, why: str, end_time: int) -> None:
    span.set_attribute("agentruntime.ended_by", why)
    span.set_status(Status(StatusCode.ERROR, f"ended without its end event ({why})"))
    span.end(end_time=end_time)


def _host(url: str) -> str:
    """The host of an endpoint URL, without any credentials it may carry (for the log)."""
    try:
        return urllib.parse.urlsplit(url if "//" in url else f"//{url}").hostname or "?"
    except ValueError:
        return "?"


def _version() -> str:
    try:
        return metadata.version("agentruntime-server")
    except metadata.PackageNotFoundError:
        return "0"


def build(endpoint: str, exporter: SpanExporter | None = None, environ: Mapping[str, str] = os.environ) -> Tracing:
    """Spans go to `exporter` (a test's, exported at once), else to OTLP/gRPC at `endpoint`
    (empty: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT), in batches."""
    resource = Resource.create({SERVICE_NAME: environ.get("OTEL_SERVICE_NAME", "agentruntime"), SERVICE_VERSION: _version()})
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint or None)))
        target = endpoint or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        log.info("tracing: spans go to OTLP/gRPC at %s", _host(target))
    return Tracing(provider)
