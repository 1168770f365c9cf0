"""A thin asyncio client over the generated stubs: one method per verb, errors with their code."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import logging
import math
import os
import random
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

log = logging.getLogger("agentruntime.worker")

# A worker tool's handler: the call's arguments (the parsed JSON object) and the WorkerCall
# (its idempotency key, runtime, handle, deadline); returns the output text. Raising makes
# the output an error result with the exception's message.
ToolHandler = Callable[[dict[str, Any], "pb.WorkerCall"], Awaitable[str] | str]

WAIT_SLICE = 30.0  # seconds one Wait asks the server for: well under any proxy's idle cut
WAIT_MARGIN = 10.0  # seconds a Wait's call deadline leaves past its server timeout
WATCH_MAX_BACKOFF = 30.0  # seconds between Watch reconnects at the most, however many max_retries allows
# Without pings a Watch or a worker's stream behind a NAT or a proxy that silently dropped the
# connection waits forever; 60 s is well above the server's floor (1 s) and any proxy's.
KEEPALIVE = 60.0
# Retries (README: "Retries and request ids"): a failed attempt of any call is tried again
# after a pause of full jitter, uniform(0, min(RETRY_CAP, RETRY_BASE * 2^n)) for the n-th
# retry (from 0), at least the RetryInfo's retry_delay when the server sends one, for as long
# as a run of failures lasts at most RETRY_WINDOW seconds (the client's `retry_window`).
RETRY_WINDOW = 60.0
RETRY_BASE = 0.1
RETRY_CAP = 5.0
_UNARY = (
    "CreateRuntime",
    "Spawn",
    "Post",
    "Wake",
    "Wait",
    "Resume",
    "Interrupt",
    "Close",
    "Inspect",
    "List",
    "GetTranscript",
    "ListRuntimes",
    "DeleteRuntime",
    "ForkRuntime",
    "ReplayRuntime",
)
# The requests that change something: each carries a request id (the caller's, or a fresh one).
_MUTATING = (
    pb.CreateRuntimeRequest,
    pb.SpawnRequest,
    pb.PostRequest,
    pb.WakeRequest,
    pb.ResumeRequest,
    pb.InterruptRequest,
    pb.CloseRequest,
    pb.DeleteRuntimeRequest,
    pb.ForkRuntimeRequest,
    pb.ReplayRuntimeRequest,
)

_DETAIL_TYPES = (
    error_details_pb2.BadRequest,
    error_details_pb2.ErrorInfo,
    error_details_pb2.ResourceInfo,
    error_details_pb2.QuotaFailure,
    error_details_pb2.RetryInfo,
)
_Detail = TypeVar("_Detail", bound=Message)
_Item = TypeVar("_Item")
_Answered = TypeVar("_Answered")  # what a long wait's attempts answer (a WaitResponse, a ReplayRuntimeResponse)


def _retryable(error: AgentRuntimeError, own_deadline: bool = False) -> bool:
    """Worth another attempt: UNAVAILABLE (the server is away, or refused without acting);
    CANCELLED, which grpc-core answers for a call that reached a server as it began to shut
    down, before a handler took it (grpc/grpc#41785); DEADLINE_EXCEEDED of the attempt's own
    deadline (`own_deadline`: it had passed; not one the server sent); and any error that
    carries RetryInfo. Never the caller's own cancellation: a cancelled asyncio task raises
    CancelledError and a closed channel UsageError, not an RPC error."""
    if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return True
    if error.code is grpc.StatusCode.DEADLINE_EXCEEDED and own_deadline:
        return True
    return error.retry_info is not None


class _Failures:
    """A run of consecutive failed attempts of one call (or of one Wait or Watch loop, which
    `reset` when an attempt succeeds): how many, and whether another attempt may start."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.count = 0
        self._since: float | None = None

    def reset(self) -> None:
        self.count = 0
        self._since = None

    def pause(self, error: AgentRuntimeError, now: float, wait: float, end: float | None = None) -> float | None:
        """Counts a failure at `now`; the seconds to wait before the next attempt (`wait`, or
        the error's RetryInfo.retry_delay when longer), or None when the next attempt would
        start after the window from this run's first failure, or after `end`."""
        if self._since is None:
            self._since = now
        info = error.retry_info
        if info is not None:
            wait = max(wait, info.retry_delay.ToNanoseconds() / 1e9)
        limit = self._since + self.window
        if end is not None:
            limit = min(limit, end)
        if now + wait >= limit:
            return None
        self.count += 1
        return wait


class _FreshDeltas:
    """Which deltas of a Watch are new to its consumer. After a reconnect the server sends every
    turn still in progress again from index 0, so per (handle, turn) this keeps the next index
    expected: a delta below it was handed over already. A `reset` (index 0: the turn's stream
    starts again) is always new, and what follows it is new from index 1."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, int], int] = {}

    def take(self, delta: pb.Delta) -> bool:
        """Whether to hand `delta` over (and, if so, it counts as handed over)."""
        key = (delta.handle_id, delta.turn)
        if delta.WhichOneof("piece") == "reset":
            self._next[key] = 1
            return True
        if delta.index < self._next.get(key, 0):
            return False
        self._next[key] = delta.index + 1
        return True

    def forget(self, event: pb.Event) -> None:
        """An ended turn is never sent again (a reconnect starts after its TurnEnded): drop it,
        so that a long watch keeps one entry per turn in progress, not per turn ever."""
        if event.WhichOneof("payload") == "turn_ended":
            self._next.pop((event.handle_id, event.turn_ended.turn), None)


class AgentRuntimeError(Exception):
    """A refused call: the gRPC code, the server's message and its google.rpc details."""

    def __init__(self, code: grpc.StatusCode, message: str, details: list[Any]) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.details = details

    def detail(self, kind: type[_Detail]) -> _Detail | None:
        """The first detail of that type: `error.detail(error_details_pb2.BadRequest)`."""
        return next((d for d in self.details if isinstance(d, kind)), None)

    # Typed accessors for the details the server sends, and predicates for the codes a
    # host branches on.
    @property
    def bad_request(self) -> error_details_pb2.BadRequest | None:
        """INVALID_ARGUMENT: one field violation per problem."""
        return self.detail(error_details_pb2.BadRequest)

    @property
    def error_info(self) -> error_details_pb2.ErrorInfo | None:
        """A reason (`HANDLE_RUNNING`, `WATCH_LAGGING`, ...) and metadata (`limit`, `quota`)."""
        return self.detail(error_details_pb2.ErrorInfo)

    @property
    def resource_info(self) -> error_details_pb2.ResourceInfo | None:
        """NOT_FOUND: the kind and name of what does not exist."""
        return self.detail(error_details_pb2.ResourceInfo)

    @property
    def quota_failure(self) -> error_details_pb2.QuotaFailure | None:
        """RESOURCE_EXHAUSTED by a tenant's quota."""
        return self.detail(error_details_pb2.QuotaFailure)

    @property
    def retry_info(self) -> error_details_pb2.RetryInfo | None:
        """How long to wait before trying again (`retry_delay`): the server sends it with every
        UNAVAILABLE it answers without having acted (a runtime moving, a draining server)."""
        return self.detail(error_details_pb2.RetryInfo)

    @property
    def reason(self) -> str:
        """The ErrorInfo reason, or "" when the error carries none."""
        info = self.error_info
        return info.reason if info is not None else ""

    @property
    def is_not_found(self) -> bool:
        return self.code is grpc.StatusCode.NOT_FOUND

    @property
    def is_invalid_argument(self) -> bool:
        return self.code is grpc.StatusCode.INVALID_ARGUMENT

    @property
    def is_failed_precondition(self) -> bool:
        return self.code is grpc.StatusCode.FAILED_PRECONDITION

    @property
    def is_resource_exhausted(self) -> bool:
        return self.code is grpc.StatusCode.RESOURCE_EXHAUSTED

    @property
    def is_unavailable(self) -> bool:
        """Worth retrying later (a restarting server, a runtime moving between replicas)."""
        return self.code is grpc.StatusCode.UNAVAILABLE

    @property
    def is_unauthenticated(self) -> bool:
        return self.code is grpc.StatusCode.UNAUTHENTICATED

    @property
    def is_permission_denied(self) -> bool:
        return self.code is grpc.StatusCode.PERMISSION_DENIED

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError) -> AgentRuntimeError:
        details: list[Any] = []
        for key, value in error.trailing_metadata() or ():
            if key != "grpc-status-details-bin" or not isinstance(value, bytes):
                continue
            for packed in status_pb2.Status.FromString(value).details:
                for kind in _DETAIL_TYPES:
                    if packed.Is(kind.DESCRIPTOR):
                        unpacked = kind()
                        packed.Unpack(unpacked)
                        details.append(unpacked)
        return cls(error.code(), error.details() or "", details)


PEM = bytes | str | os.PathLike[str]
"""PEM data as bytes, or the path of a PEM file (a str or a Path)."""


def _pem(value: PEM | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    try:
        return Path(value).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the {what} file {os.fspath(value)}: {error.strerror}") from None


async def _paged(fetch: Callable[[str], Awaitable[tuple[Sequence[_Item], str]]]) -> AsyncIterator[_Item]:
    """Every item of every page; `fetch(token)` gives a page's items and the next page's token
    (empty after the last), and is called only when the page before is used up."""
    token = ""
    while True:
        items, token = await fetch(token)
        for item in items:
            yield item
        if not token:
            return


def _doubled(base: float, failures: int, cap: float) -> float:
    """base * 2^failures seconds, at most `cap`. The exponent stops growing long past any cap:
    at 2^1024 the product is no float, and a caller whose server is away for an hour must not
    die of OverflowError."""
    return min(cap, base * 2.0 ** min(failures, 64))


def _jittered(base: float, failures: int, cap: float) -> float:
    """A random wait up to `_doubled` (full jitter)."""
    return random.uniform(0, _doubled(base, failures, cap))


def _request_id(given: str | None) -> str:
    """The caller's request id, or a fresh one (a random UUID) when it gave none."""
    return given or str(uuid.uuid4())


def _duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


class Client:
    """`async with Client("127.0.0.1:50051") as client: result = await client.run(rt, "coordinator", "...")`

    Plaintext by default. `tls=True` verifies the server against the system's roots;
    `root_certificates` (a CA as PEM bytes, or a PEM file's path) against that CA instead;
    `client_cert` and `client_key` (both, PEM bytes or paths) present a client certificate
    (mTLS). Any of the three implies TLS. `token` is sent as `authorization: Bearer <token>`
    on every call (over TLS, or plaintext to a loopback server). While a call is open the
    connection is pinged after `keepalive` seconds (60) without activity and dropped when no
    answer comes within `keepalive_timeout` (20); `keepalive=None` sends no pings,
    `keepalive_without_calls=True` pings an idle connection too.

    Every call is retried when an attempt fails with UNAVAILABLE (and the other failures
    `_retryable` names), with backoff and full jitter, for up to `retry_window` seconds (60)
    from the first failure; each mutating call carries a request id (`request_id=`, or a
    fresh UUID), the same on every attempt, so that a repeat takes effect once.
    `retries=False` makes one attempt of every call (the request id is still sent).
    `timeout` is each attempt's deadline."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        root_certificates: PEM | None = None,
        client_cert: PEM | None = None,
        client_key: PEM | None = None,
        timeout: float | None = 60.0,
        keepalive: float | None = KEEPALIVE,
        keepalive_timeout: float = 20.0,
        keepalive_without_calls: bool = False,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
        retries: bool = True,
        retry_window: float = RETRY_WINDOW,
    ) -> None:
        if (client_cert is None) != (client_key is None):
            raise ValueError("client_cert and client_key go together: give both for mTLS, or neither")
        if keepalive is not None and keepalive <= 0:
            raise ValueError("keepalive is the seconds between pings: give a positive number, or None for no pings")
        if math.isnan(retry_window) or retry_window < 0:
            raise ValueError("retry_window is the seconds a run of failures is retried for: give a number >= 0")
        self._retries = retries
        self._retry_window = retry_window
        options: list[tuple[str, Any]] = []
        if keepalive is not None:
            # A long Wait, a Watch or a worker's stream notices a dead peer (or a proxy that
            # dropped the connection) within keepalive + keepalive_timeout. gRPC's default of two
            # pings without data would stop the pings on a quiet Watch: no limit.
            options += [
                ("grpc.keepalive_time_ms", int(keepalive * 1000)),
                ("grpc.keepalive_timeout_ms", int(keepalive_timeout * 1000)),
                ("grpc.keepalive_permit_without_calls", int(keepalive_without_calls)),
                ("grpc.http2.max_pings_without_data", 0),
            ]
        options += list(channel_options)
        self._channel_options = tuple(options)
        roots = _pem(root_certificates, "root_certificates")
        chain = _pem(client_cert, "client_cert")
        key = _pem(client_key, "client_key")
        if tls or roots is not None or chain is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)
            self._channel = grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
        self._stub = pb_grpc.AgentRuntimeStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout

    @property
    def stub(self) -> pb_grpc.AgentRuntimeStub:
        """The generated stub on this client's channel, for what the thin methods do not
        cover; pass `metadata=client.metadata` so that the call carries the token."""
        return self._stub

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call sends: the bearer token, if any."""
        return self._metadata

    @property
    def channel_options(self) -> tuple[tuple[str, Any], ...]:
        """The gRPC channel arguments the channel was made with: the keepalive and then
        `channel_options`, in that order."""
        return self._channel_options

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        await self.close_channel()

    async def close_channel(self) -> None:
        await self._channel.close()

    @property
    def retries(self) -> bool:
        """Whether failed attempts are retried (the constructor's `retries`)."""
        return self._retries

    @property
    def retry_window(self) -> float:
        """The seconds a run of failed attempts is retried for (the constructor's `retry_window`)."""
        return self._retry_window

    def _failures(self) -> _Failures:
        return _Failures(self._retry_window)

    async def _attempt(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        """One attempt of a unary call; `timeout` is its deadline (default: the client's)."""
        try:
            return await method(request, timeout=timeout or self._timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise AgentRuntimeError.from_rpc_error(error) from None

    async def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        """A unary call, attempted again after a failure `_retryable` names while the retry
        window allows (never after the caller cancelled: CancelledError is no RPC error);
        the same request, request id included, every time."""
        loop = asyncio.get_running_loop()
        deadline = timeout or self._timeout
        failures = self._failures()
        while True:
            started = loop.time()
            try:
                return await self._attempt(method, request, timeout)
            except AgentRuntimeError as error:
                own_deadline = deadline is not None and loop.time() - started >= deadline
                if not self._retries or not _retryable(error, own_deadline):
                    raise
                pause = failures.pause(error, loop.time(), _jittered(RETRY_BASE, failures.count, RETRY_CAP))
                if pause is None:
                    raise
            await asyncio.sleep(pause)

    async def call(self, method: str, request: Message, *, timeout: float | None = None) -> Any:
        """Any unary RPC by its name (`"Post"`, `"Close"`, ...) with a request message the thin
        methods do not build (Post's `trust`, Close's `grace`), retried as they are; a request
        that has a `request_id` and leaves it empty is sent with a fresh one (the caller's
        message is not changed). Returns the whole response message; `timeout` is each
        attempt's deadline (default: the client's).

            response = await client.call("Post", pb.PostRequest(runtime_id=rt, handle_id=h, text=t, trust=pb.TRUST_EXTERNAL))"""
        if method not in _UNARY:
            raise ValueError(f"{method!r} is no unary RPC of AgentRuntime: one of {', '.join(_UNARY)}")
        if isinstance(request, _MUTATING) and not request.request_id:
            fresh = copy.deepcopy(request)
            fresh.request_id = _request_id(None)
            request = fresh
        return await self._call(getattr(self._stub, method), request, timeout)

    async def create_runtime(self, agents: Sequence[pb.AgentDef], runtime_id: str = "", *, request_id: str | None = None) -> str:
        request = pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=agents, request_id=_request_id(request_id))
        response = await self._call(self._stub.CreateRuntime, request)
        return str(response.runtime_id)

    async def spawn(
        self, runtime_id: str, agent: str, parent: str = "root", budget: pb.Budget | None = None, *, request_id: str | None = None
    ) -> str:
        request = pb.SpawnRequest(
            runtime_id=runtime_id, parent_id=parent, agent=agent, budget=budget, request_id=_request_id(request_id)
        )
        return str((await self._call(self._stub.Spawn, request)).handle_id)

    async def post(
        self, runtime_id: str, handle_id: str, text: str, channel: str = "", sender: str = "", *, request_id: str | None = None
    ) -> int:
        request = pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text=text, channel=channel, sender=sender)
        request.request_id = _request_id(request_id)
        return int((await self._call(self._stub.Post, request)).inbox_size)

    async def wake(self, runtime_id: str, handle_id: str, prompt: str = "", *, request_id: str | None = None) -> bool:
        request = pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=prompt, request_id=_request_id(request_id))
        return bool((await self._call(self._stub.Wake, request)).queued)

    async def wait(self, runtime_id: str, handle_id: str, timeout: float | None = None) -> pb.TaskResult:
        """The handle's settled (or PENDING) result, however long the run takes; with
        `timeout`, after that many seconds at most the server's TIMEOUT result (the handle
        still running). TIMEOUT is the caller's choice, never the transport's: each Wait asks
        the server for at most WAIT_SLICE seconds, under the call's deadline, and is repeated.
        A failed Wait is retried as every call is (`_retryable`, with backoff and jitter, at
        least the RetryInfo's delay), for a run of failures of at most the retry window and
        never past `timeout`: a server that is restarting is waited for, one that keeps
        failing (UNAVAILABLE STORE_BROKEN) fails the wait after the window."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout

        def next_slice() -> float:
            remaining = None if end is None else max(end - loop.time(), 0.0)
            return WAIT_SLICE if remaining is None else min(WAIT_SLICE, remaining)

        async def attempt(slice_: float) -> pb.WaitResponse:
            request = pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id, timeout=_duration(slice_))
            response: pb.WaitResponse = await self._attempt(self._stub.Wait, request, timeout=slice_ + WAIT_MARGIN)
            return response

        waited = await self._long_wait(attempt, next_slice, lambda response: response.result.status != pb.STATUS_TIMEOUT, end)
        return waited.result

    async def _long_wait(
        self,
        attempt: Callable[[float], Awaitable[_Answered]],
        next_slice: Callable[[], float],
        done: Callable[[_Answered], bool],
        end: float | None,
    ) -> _Answered:
        """Wait's and replay_runtime's loop: an attempt asks the server to wait at most a slice
        (under its own deadline, WAIT_MARGIN past it) and is made again until its answer is
        `done` or `end` passes; a failed one is retried as every call is (`_retryable`, with
        backoff and jitter, at least the RetryInfo's delay), for a run of failures of at most
        the retry window and never past `end`."""
        loop = asyncio.get_running_loop()
        failures = self._failures()
        while True:
            slice_ = next_slice()
            started = loop.time()
            try:
                answered = await attempt(slice_)
            except AgentRuntimeError as error:
                own_deadline = loop.time() - started >= slice_ + WAIT_MARGIN
                if not self._retries or not _retryable(error, own_deadline):
                    raise
                pause = failures.pause(error, loop.time(), _jittered(RETRY_BASE, failures.count, RETRY_CAP), end)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
                continue
            failures.reset()
            if done(answered) or (end is not None and loop.time() >= end):
                return answered

    async def resume(self, runtime_id: str, answer: pb.Answer, *, request_id: str | None = None) -> pb.TaskResult:
        """Answers a pending Request and returns the next result (settled, or PENDING again)."""
        request = pb.ResumeRequest(runtime_id=runtime_id, answer=answer, request_id=_request_id(request_id))
        response = await self._call(self._stub.Resume, request)
        return response.result  # type: ignore[no-any-return]

    async def run(
        self,
        runtime_id: str,
        agent: str,
        prompt: str,
        parent: str = "root",
        *,
        spawn_request_id: str | None = None,
        wake_request_id: str | None = None,
    ) -> pb.TaskResult:
        """Spawn + Wake + Wait: the settled (or PENDING) result of a fresh handle. The Spawn
        and the Wake each carry a request id (the caller's, or a fresh one), so a retried one
        spawns one handle and runs it once."""
        handle_id = await self.spawn(runtime_id, agent, parent, request_id=_request_id(spawn_request_id))
        await self.wake(runtime_id, handle_id, prompt, request_id=_request_id(wake_request_id))
        return await self.wait(runtime_id, handle_id)

    async def interrupt(self, runtime_id: str, handle_id: str, *, request_id: str | None = None) -> bool:
        request = pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id, request_id=_request_id(request_id))
        return bool((await self._call(self._stub.Interrupt, request)).interrupted)

    async def close(self, runtime_id: str, handle_id: str, force: bool = False, *, request_id: str | None = None) -> list[str]:
        request = pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id, force=force, request_id=_request_id(request_id))
        return list((await self._call(self._stub.Close, request)).closed_handle_ids)

    async def inspect(self, runtime_id: str, handle_id: str) -> pb.HandleView:
        request = pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id)
        return (await self._call(self._stub.Inspect, request)).handle  # type: ignore[no-any-return]

    async def list_page(self, runtime_id: str, page_size: int = 0, page_token: str = "") -> pb.ListResponse:
        """One page of List: at most `page_size` handles (0: the server's default) from
        `page_token` on; its `next_page_token` is empty on the last page."""
        request = pb.ListRequest(runtime_id=runtime_id, page_size=page_size, page_token=page_token)
        return await self._call(self._stub.List, request)  # type: ignore[no-any-return]

    async def iter_handles(self, runtime_id: str, page_size: int = 0) -> AsyncIterator[pb.HandleView]:
        """The runtime's handles in spawn order, a page (of `page_size`, 0: the server's
        default) fetched as the loop reaches it."""

        async def page(token: str) -> tuple[Sequence[pb.HandleView], str]:
            response = await self.list_page(runtime_id, page_size, token)
            return response.handles, response.next_page_token

        async for handle in _paged(page):
            yield handle

    async def list_handles(self, runtime_id: str) -> list[pb.HandleView]:
        """Every handle of the runtime, in spawn order (all pages)."""
        return [handle async for handle in self.iter_handles(runtime_id)]

    async def transcript_page(
        self, runtime_id: str, handle_id: str, page_size: int = 0, page_token: str = ""
    ) -> pb.GetTranscriptResponse:
        """One page of GetTranscript: at most `page_size` messages (0: the server's default)
        from `page_token` on; its `next_page_token` is empty on the last page."""
        request = pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id, page_size=page_size, page_token=page_token)
        return await self._call(self._stub.GetTranscript, request)  # type: ignore[no-any-return]

    async def iter_transcript(self, runtime_id: str, handle_id: str, page_size: int = 0) -> AsyncIterator[pb.Message]:
        """The handle's stored transcript in order, a page fetched as the loop reaches it."""

        async def page(token: str) -> tuple[Sequence[pb.Message], str]:
            response = await self.transcript_page(runtime_id, handle_id, page_size, token)
            return response.messages, response.next_page_token

        async for message in _paged(page):
            yield message

    async def transcript(self, runtime_id: str, handle_id: str) -> list[pb.Message]:
        """The handle's whole stored transcript (all pages)."""
        return [message async for message in self.iter_transcript(runtime_id, handle_id)]

    async def list_runtimes_page(
        self, page_size: int = 0, page_token: str = "", *, forks_of: str = ""
    ) -> pb.ListRuntimesResponse:
        """One page of ListRuntimes: at most `page_size` of the caller's runtimes (0: the
        server's default), newest first, from `page_token` on; `next_page_token` is empty on
        the last page. `forks_of`: only the forks (and replays) of that runtime."""
        request = pb.ListRuntimesRequest(page_size=page_size, page_token=page_token, forks_of=forks_of)
        return await self._call(self._stub.ListRuntimes, request)  # type: ignore[no-any-return]

    async def iter_runtimes(self, page_size: int = 0, *, forks_of: str = "") -> AsyncIterator[pb.RuntimeSummary]:
        """The caller's runtimes (`forks_of`: that runtime's forks and replays only), newest
        first, a page fetched as the loop reaches it."""

        async def page(token: str) -> tuple[Sequence[pb.RuntimeSummary], str]:
            response = await self.list_runtimes_page(page_size, token, forks_of=forks_of)
            return response.runtimes, response.next_page_token

        async for runtime in _paged(page):
            yield runtime

    async def list_runtimes(self, *, forks_of: str = "") -> list[pb.RuntimeSummary]:
        """Every runtime of the caller's tenant (`forks_of`: that runtime's forks and replays
        only), newest first (all pages)."""
        return [runtime async for runtime in self.iter_runtimes(forks_of=forks_of)]

    async def fork_runtime(
        self,
        source_runtime_id: str,
        at_seq: int,
        *,
        runtime_id: str = "",
        agents: Sequence[pb.AgentDef] = (),
        messages: Sequence[pb.ForkMessage] = (),
        answers: Sequence[pb.Answer] = (),
        request_id: str | None = None,
    ) -> pb.ForkRuntimeResponse:
        """A new runtime holding `source_runtime_id`'s journal up to the step that made its event
        `at_seq` (a Watch seq): replayed, never executed, the runs in flight at the cut held
        (HANDLE_STATE_HELD) until a Wake. `agents` replace (by name) or add definitions,
        `messages` replace handles' last user messages, `answers` answer Requests pending at the
        cut. Returns the fork's id, its `fork_seq` (the last event of the source it holds) and
        the held handles. Retried as every mutating call is, with one request id (the caller's,
        or a fresh one): a repeat makes one fork."""
        request = pb.ForkRuntimeRequest(
            source_runtime_id=source_runtime_id,
            at_seq=at_seq,
            runtime_id=runtime_id,
            agents=agents,
            messages=messages,
            answers=answers,
            request_id=_request_id(request_id),
        )
        return await self._call(self._stub.ForkRuntime, request)  # type: ignore[no-any-return]

    async def replay_runtime(
        self,
        source_runtime_id: str,
        *,
        agents: Sequence[pb.AgentDef] = (),
        unrecorded_calls: pb.UnrecordedCalls.ValueType = pb.UNRECORDED_CALLS_UNSPECIFIED,
        runtime_id: str = "",
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> pb.ReplayRuntimeResponse:
        """Runs `source_runtime_id`'s root prompts again in a new runtime (the replay), with
        `agents` replacing the recording's definitions by name, tool calls answered from the
        recording (`unrecorded_calls`: what a call it does not have does), and returns, per root,
        the recording and the replay side by side, once every root of the replay has settled,
        however long that takes.

        Like `wait`, a long wait: each ReplayRuntime asks the server to wait at most WAIT_SLICE
        seconds (`ReplayRuntimeRequest.timeout`), under the call's deadline, and while its answer
        says `settled: false` the same request (the same request id: nothing starts twice) is
        sent again. Every attempt is the same request, so with `timeout` the slice is that
        timeout cut into equal parts of at most WAIT_SLICE; after `timeout` seconds the last
        (unsettled) answer is returned. Failed attempts are retried as `wait`'s are."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        if timeout is None or timeout <= 0:
            slice_ = WAIT_SLICE if timeout is None else 0.0
        else:
            slice_ = timeout / math.ceil(timeout / WAIT_SLICE)
        request = pb.ReplayRuntimeRequest(
            source_runtime_id=source_runtime_id,
            agents=agents,
            unrecorded_calls=unrecorded_calls,
            runtime_id=runtime_id,
            timeout=_duration(slice_),
            request_id=_request_id(request_id),
        )

        async def attempt(slice_: float) -> pb.ReplayRuntimeResponse:
            response: pb.ReplayRuntimeResponse = await self._attempt(self._stub.ReplayRuntime, request, slice_ + WAIT_MARGIN)
            return response

        return await self._long_wait(attempt, lambda: slice_, lambda response: response.settled, end)

    async def delete_runtime(self, runtime_id: str, force: bool = False, *, request_id: str | None = None) -> None:
        """Closes the runtime and deletes everything stored of it; `force` interrupts running
        handles (without it a runtime with running handles is refused)."""
        request = pb.DeleteRuntimeRequest(runtime_id=runtime_id, force=force, request_id=_request_id(request_id))
        await self._call(self._stub.DeleteRuntime, request)

    async def watch(
        self, runtime_id: str, after_seq: int = 0, *, max_retries: int = 5, backoff: float = 1.0
    ) -> AsyncIterator[pb.Event]:
        """The runtime's events after `after_seq`, in order, once each; never ends by itself.

        A dropped stream (an error `_retryable` names, such as UNAVAILABLE or CANCELLED from the
        server, or RESOURCE_EXHAUSTED with reason WATCH_LAGGING when this consumer fell too far
        behind) is reopened from the last seq seen, so nothing is missed or seen twice. The
        error is raised after `max_retries` reconnects in a row with no event between them
        (waiting `backoff` seconds, doubling up to 30, or the RetryInfo's delay when longer,
        before each), or when such a run of failures would outlast the retry window; at once
        with `retries=False`."""
        async for item in self._watch_items(runtime_id, after_seq, False, max_retries, backoff):
            if isinstance(item, pb.Event):
                yield item

    async def watch_with_deltas(
        self, runtime_id: str, after_seq: int = 0, *, max_retries: int = 5, backoff: float = 1.0
    ) -> AsyncIterator[pb.Event | pb.Delta]:
        """`watch` with what the models write as they write it: the runtime's events and, between
        them, the `Delta`s of every handle's model turns (docs/streaming.md); never ends by itself.

        Reconnects as `watch` does (a delta handed over that is no `reset` counts as progress,
        as an event does). The server sends a turn still in progress again from index 0 after a
        reconnect: each delta is handed over once, by (handle_id, turn, index), except a `reset`,
        which is always handed over and voids what was handed over of its turn."""
        async for item in self._watch_items(runtime_id, after_seq, True, max_retries, backoff):
            yield item

    async def stream_run(
        self,
        runtime_id: str,
        agent: str,
        prompt: str,
        parent: str = "root",
        *,
        spawn_request_id: str | None = None,
        wake_request_id: str | None = None,
        max_retries: int = 5,
        backoff: float = 1.0,
    ) -> AsyncIterator[pb.Delta | pb.TaskResult]:
        """`run`, with the handle's model output as it streams: Spawn and Wake as `run` does,
        then the fresh handle's `Delta`s (text, thinking, tool-call pieces, and a `reset` that
        voids its turn's pieces so far), each once, and last its first `TaskResult` (settled, or
        PENDING). Watches the runtime from the start with deltas, reconnecting as
        `watch_with_deltas` does. The Wake is sent once the Watch has answered (the handle's
        spawn, at least): a provider's turn streams only to watchers there when it starts.

            async for item in client.stream_run(rt, "writer", "Tell me about streams."):
                if isinstance(item, pb.Delta):
                    print(item.text, end="", flush=True)
                else:
                    result = item"""
        handle_id = await self.spawn(runtime_id, agent, parent, request_id=_request_id(spawn_request_id))
        woken = False
        async with contextlib.aclosing(self._watch_items(runtime_id, 0, True, max_retries, backoff)) as items:
            async for item in items:
                if not woken:
                    await self.wake(runtime_id, handle_id, prompt, request_id=_request_id(wake_request_id))
                    woken = True
                if isinstance(item, pb.Delta):
                    if item.handle_id == handle_id:
                        yield item
                elif item.handle_id == handle_id and item.WhichOneof("payload") == "result":
                    yield item.result
                    return

    async def _watch_items(
        self, runtime_id: str, after_seq: int, deltas: bool, max_retries: int, backoff: float
    ) -> AsyncGenerator[pb.Event | pb.Delta, None]:
        """The Watch stream's events from `after_seq`, reopened from the last event's seq after
        a drop (`watch` says when it gives up); with `deltas`, the deltas too, the ones already
        handed over skipped. Deltas do not move the seq: the server sends a turn in progress
        again. The events come in batches (WatchRequest.batch), handed over one at a time."""
        loop = asyncio.get_running_loop()
        seen = after_seq
        failures = self._failures()
        fresh = _FreshDeltas()
        while True:
            request = pb.WatchRequest(runtime_id=runtime_id, after_seq=seen, deltas=deltas, batch=True)
            call = self._stub.Watch(request, metadata=self._metadata)
            try:
                async for response in call:
                    if response.HasField("delta"):
                        if not fresh.take(response.delta):
                            continue
                        if response.delta.WhichOneof("piece") != "reset":
                            failures.reset()
                        yield response.delta
                        continue
                    # (a server from before batches sends one event a response, in `event`)
                    for event in response.events or (response.event,):
                        failures.reset()
                        seen = event.seq
                        fresh.forget(event)
                        yield event
                # The server ended the stream (it is shutting down): reopen it like a drop.
                error = AgentRuntimeError(grpc.StatusCode.UNAVAILABLE, "the server ended the Watch stream", [])
            except grpc.aio.AioRpcError as rpc_error:
                error = AgentRuntimeError.from_rpc_error(rpc_error)
            finally:
                call.cancel()
            lagging = error.code is grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == "WATCH_LAGGING"
            if not self._retries or not (lagging or _retryable(error)) or failures.count >= max_retries:
                raise error
            pause = failures.pause(error, loop.time(), 0.0 if lagging else _doubled(backoff, failures.count, WATCH_MAX_BACKOFF))
            if pause is None:
                raise error
            await asyncio.sleep(pause)

    async def serve_tools(
        self,
        queue: str,
        handlers: Mapping[str, ToolHandler],
        *,
        max_concurrent_calls: int = 10,
        backoff: float = 0.25,
        max_backoff: float = 10.0,
        registered: Callable[[str], None] | None = None,
    ) -> None:
        """Serves worker tools (ToolDef.worker) of `queue` until cancelled: `handlers` maps
        each tool name to its handler, which runs concurrently, at most
        `max_concurrent_calls` at once. A handler that raises answers an error result with
        the exception's message. A dropped connection is reopened with backoff (doubling from
        `backoff`, with jitter, up to `max_backoff` seconds); a refused registration
        (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED) raises. `registered(worker_id)`
        is called on every (re)connection.

            async def weather(arguments, call):
                return f"sunny in {arguments['city']}"

            await client.serve_tools("weather", {"forecast": weather})"""
        failures = 0
        while True:
            try:
                await self._serve_tools_once(queue, handlers, max_concurrent_calls, registered)
                failures = 0  # the server ended the stream (a restart): connect again
            except grpc.aio.AioRpcError as error:
                if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                    raise AgentRuntimeError.from_rpc_error(error) from None
                failures += 1
                log.warning("ServeTools dropped (%s); reconnecting", error.code().name)
            await asyncio.sleep(_jittered(backoff, failures, max_backoff))

    async def _serve_tools_once(
        self,
        queue: str,
        handlers: Mapping[str, ToolHandler],
        limit: int,
        registered: Callable[[str], None] | None,
    ) -> None:
        outputs: asyncio.Queue[pb.ServeToolsRequest] = asyncio.Queue()
        await outputs.put(
            pb.ServeToolsRequest(
                registration=pb.WorkerRegistration(queue=queue, tools=sorted(handlers), max_concurrent_calls=limit)
            )
        )

        async def requests() -> AsyncIterator[pb.ServeToolsRequest]:
            while True:
                yield await outputs.get()

        async def answer(call: pb.WorkerCall) -> None:
            handler = handlers.get(call.call.name)
            try:
                if handler is None:
                    raise LookupError(f"this worker has no handler for {call.call.name!r}")
                arguments = json.loads(call.call.arguments_json or "{}")
                produced = handler(arguments, call)
                output = await produced if inspect.isawaitable(produced) else produced
                reply = pb.ToolOutput(call_id=call.id, output=str(output))
            except Exception as error:  # the tool's failure is its result, for the model to see
                reply = pb.ToolOutput(call_id=call.id, output=f"{type(error).__name__}: {error}", is_error=True)
            await outputs.put(pb.ServeToolsRequest(output=reply))

        running: set[asyncio.Task[None]] = set()
        stream = self._stub.ServeTools(requests(), metadata=self._metadata)
        try:
            async for response in stream:
                if response.HasField("registered"):
                    if registered is not None:
                        registered(response.registered.worker_id)
                    continue
                task = asyncio.ensure_future(answer(response.call))  # the server keeps to the limit
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            stream.cancel()
            for task in running:
                task.cancel()
