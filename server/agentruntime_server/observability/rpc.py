"""The gRPC edge, observed: one server interceptor counts and times every call by method
and final status code (a call the servicer refuses with abort carries its canonical code,
read back from the context), opens the call's span when tracing is on, and sets the log
context from the request's runtime_id/handle_id when JSON logs are on. Server streaming
(Watch) goes through it unchanged."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from ..domain.limits import MAX_ID_CHARS
from .logs import log_context

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .metrics import Metrics
    from .tracing import Tracing

Context = grpc.aio.ServicerContext[Any, Any]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Any, Any] | None"]]
OK = grpc.StatusCode.OK
UNKNOWN = grpc.StatusCode.UNKNOWN
CANCELLED = grpc.StatusCode.CANCELLED


class _Probe:
    """One method's metric children, labelled once (by code, as codes are seen)."""

    __slots__ = ("_by_code", "_labels", "_metrics", "started")

    def __init__(self, metrics: Metrics, labels: tuple[str, str, str]) -> None:
        self._metrics = metrics
        self._labels = labels
        self._by_code: dict[grpc.StatusCode, tuple[Any, Any]] = {}
        self.started = metrics.rpc_started.labels(*labels)

    def done(self, code: grpc.StatusCode, seconds: float) -> None:
        pair = self._by_code.get(code)
        if pair is None:
            pair = (
                self._metrics.rpc_handled.labels(*self._labels, code.name),
                self._metrics.rpc_seconds.labels(*self._labels, code.name),
            )
            self._by_code[code] = pair
        pair[0].inc()
        pair[1].observe(seconds)


def _final_code(context: Context, error: BaseException | None) -> grpc.StatusCode:
    """The status the call ends with: what the servicer set (abort sets it), else OK, or for
    an exception that set nothing, CANCELLED (the call was cancelled) or UNKNOWN (what gRPC
    answers for an escaped exception)."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if error is None:
        return OK
    return CANCELLED if isinstance(error, asyncio.CancelledError | GeneratorExit) else UNKNOWN


def _request_ids(request: Any) -> tuple[str, str]:
    """The request's runtime and handle ids, clipped to the longest a real id can be: they are
    read before the caller is authenticated or the ids are checked, and a stranger's megabyte
    id must not ride along on every span and log line of the call."""
    return (
        str(getattr(request, "runtime_id", ""))[:MAX_ID_CHARS],
        str(getattr(request, "handle_id", ""))[:MAX_ID_CHARS],
    )


class ObservingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics | None, tracing: Tracing | None, log_context: bool) -> None:
        self._metrics = metrics
        self._tracing = tracing
        self._log_context = log_context
        # method -> (the handler gRPC gave, its wrapper): one wrapper per method, not per call.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        service, _, name = method.lstrip("/").rpartition("/")
        kinds: tuple[tuple[str, Any, Callable[..., grpc.RpcMethodHandler[Any, Any]]], ...] = (
            ("unary", handler.unary_unary, grpc.unary_unary_rpc_method_handler),
            ("server_stream", handler.unary_stream, grpc.unary_stream_rpc_method_handler),
            ("client_stream", handler.stream_unary, grpc.stream_unary_rpc_method_handler),
            ("bidi_stream", handler.stream_stream, grpc.stream_stream_rpc_method_handler),
        )
        found = next(((kind, behavior, make) for kind, behavior, make in kinds if behavior is not None), None)
        if found is None:
            return handler
        kind, behavior, make = found
        probe = _Probe(self._metrics, (service, name, kind)) if self._metrics is not None else None
        tracing = self._tracing
        set_log_context = self._log_context

        def begin(request: Any, context: Context) -> Span | None:
            if probe is not None:
                probe.started.inc()
            runtime_id, handle_id = _request_ids(request)
            if set_log_context and runtime_id:
                log_context.set((runtime_id, handle_id))
            if tracing is not None:
                return tracing.start_rpc(service, name, context.invocation_metadata(), runtime_id, handle_id)
            return None

        def end(span: Span | None, code: grpc.StatusCode, started: float) -> None:
            if probe is not None:
                probe.done(code, time.perf_counter() - started)
            if span is not None and tracing is not None:
                tracing.end_rpc(span, code)

        if not inspect.isasyncgenfunction(behavior):
            # A unary handler, or a streaming one that writes with context.write() (health's Watch).

            async def call(request: Any, context: Context) -> Any:
                started = time.perf_counter()
                span = begin(request, context)
                token = tracing.activate(span) if span is not None and tracing is not None else None
                error: BaseException | None = None
                try:
                    return await behavior(request, context)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    if token is not None and tracing is not None:
                        tracing.deactivate(token)
                    end(span, _final_code(context, error), started)

            new = make(call, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        else:

            async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
                # The span is not made current: a generator's context must not be held across its yields.
                started = time.perf_counter()
                span = begin(request, context)
                error: BaseException | None = None
                responses = behavior(request, context)
                try:
                    async for response in responses:
                        yield response
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    await responses.aclose()  # its own cleanup runs now, as it would without us
                    end(span, _final_code(context, error), started)

            new = make(stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        return new
