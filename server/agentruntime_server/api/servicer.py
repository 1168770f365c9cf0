"""The gRPC service: each RPC checks its required fields, converts, hands off to the domain and
converts back; what every RPC goes through around that is the edge (edge.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.protobuf.message import Message as ProtoMessage

from ..domain.errors import (
    DomainError,
    FieldViolation,
    InvalidArgument,
    OwnedElsewhere,
    StoreBroken,
    Unauthenticated,
    Unavailable,
)
from ..domain.limits import MAX_CLOSE_GRACE, MAX_WAIT_TIMEOUT
from ..domain.runtime.runtime import Runtime
from ..domain.runtime.service import RuntimeService
from ..domain.watching.deltas import Delta
from ..domain.watching.event_log import BATCH
from . import convert, paging
from .auth_failures import FailedAuthentications
from .branches import ForkAndReplay
from .definitions_memo import DecodedDefinitions
from .edge import (
    Context,
    Handler,
    Req,
    Resp,
    Undecodable,
    audit_call,
    current_caller,
    decoded,
    decoder,
    edge,
    metadata_of,
    moving_between_replicas,
    refuse_undecodable,
    require,
    route,
    tenant,
)
from .errors import to_grpc_status
from .forward import RETRIED, Forwarder, PeerUnavailable, Relayed, backoff, forwarded
from .principals import DEFAULT, Authenticator, Principal
from .request_ids import request_key
from .serve_tools import checked_registration, read_outputs
from .watch_batches import batched, event_to_proto
from .worker_hub import WorkerHub, WorkerStream

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["AgentRuntime"]
STREAM_RECHECK_SECONDS = 1.0  # an open stream verifies its caller's credential again at most this often


class AgentRuntimeServicer(ForkAndReplay, pb_grpc.AgentRuntimeServicer):
    def __init__(
        self,
        service: RuntimeService,
        max_message_bytes: int = 4 << 20,
        authenticator: Authenticator | None = None,
        forwarder: Forwarder | None = None,
        retry_for: float = 30.0,
        *,
        workers: WorkerHub[Any],  # (of whatever stream type it connects: app.py's WorkerPool)
        max_text_bytes: int = 256 << 10,
        kill_after_commit: frozenset[str] = frozenset(),
        count_auth_failure: Callable[[str, str], None] | None = None,
    ) -> None:
        """`count_auth_failure(method, reason)`: the failed-authentication metric, when metrics are on."""
        self.service = service
        self.definitions = DecodedDefinitions()
        self.failed_authentications = FailedAuthentications(count_auth_failure)
        self.kill_after_commit = kill_after_commit
        self.authenticator = authenticator or Authenticator()
        # Replicas: calls for runtimes another replica runs go there; `retry_for` bounds how
        # long a call with no deadline waits for a dead owner's runtimes to be taken over.
        self.forwarder = forwarder
        self.retry_for = retry_for
        self.workers = workers
        self.max_text_bytes = max_text_bytes
        # A page stays well under the send limit, whatever one message holds (each is bounded).
        self.page_bytes = max_message_bytes // 2

    async def authenticate(self, context: Context, method: str) -> Principal:
        if self.authenticator.mode == "none":  # everyone is the default tenant: no metadata to read
            return DEFAULT
        try:
            return await self.authenticator.authenticate(metadata_of(context), method)
        except Unauthenticated as refused:
            self.failed_authentications.record(method, context.peer() or "", refused)
            raise

    async def _verified_again(self, context: Context, method: str, verified_at: float) -> float:
        """Streams outlive credentials: before a stream sends more, a credential revoked or
        expired since it opened (or now of another tenant) ends it. Returns when it was last verified."""
        now = time.monotonic()
        if now - verified_at < STREAM_RECHECK_SECONDS:
            return verified_at
        if (await self.authenticate(context, method)).tenant != tenant():
            refused = Unauthenticated("the credential now names another tenant; open the stream again", "tenant_changed")
            self.failed_authentications.record(method, context.peer() or "", refused)
            raise refused
        return now

    async def serve(self, method: Handler[Req, Resp], request: Req, context: Context) -> Resp:
        """Serves the call here, or where its runtime runs (see api/forward.py)."""
        name = method.__name__
        missed: float | None = None  # when the owner was first missed (not when the call began)
        attempt = 0
        while True:
            try:
                return await method(self, request, context)
            except OwnedElsewhere as moved:
                metadata = metadata_of(context)
                if self.forwarder is None or forwarded(metadata):
                    raise moving_between_replicas(getattr(request, "runtime_id", "")) from None
                if moved.address:
                    route.set(("forwarded_to", moved.address))
                    try:
                        answer: Resp = await self.forwarder.unary(
                            name, request, moved.address, metadata, context.time_remaining()
                        )
                        return answer
                    except PeerUnavailable:
                        # A call with a request id is safe to send again: its first answer, if
                        # it took effect, is recorded with that effect, wherever it runs next.
                        if name not in RETRIED and not getattr(request, "request_id", ""):
                            raise moving_between_replicas(getattr(request, "runtime_id", "")) from None
            missed = time.monotonic() if missed is None else missed
            await self._pause(attempt, missed, context, getattr(request, "runtime_id", ""))
            attempt += 1

    async def _pause(self, attempt: int, missed: float, context: Context, runtime_id: str) -> None:
        """Before asking again who runs a runtime whose owner could not be reached (since
        `missed`: a Wait or a Watch forwarded for an hour still gets the whole retry window
        when its owner dies)."""
        delay = backoff(attempt)
        remaining = context.time_remaining()
        if (remaining is not None and remaining < delay) or time.monotonic() - missed + delay > self.retry_for:
            raise moving_between_replicas(runtime_id)
        await asyncio.sleep(delay)

    async def _runtime(self, runtime_id: str) -> Runtime:
        require(runtime_id=runtime_id)
        return await self.service.runtime(runtime_id, tenant())

    async def _handle_target(self, request: Any) -> Runtime:
        require(runtime_id=request.runtime_id, handle_id=request.handle_id)
        return await self.service.runtime(request.runtime_id, tenant())

    async def _readable(self, request: Any, handle: bool = True) -> Runtime:
        """For reads: replicas read a runtime another replica runs from the database."""
        if handle:
            require(runtime_id=request.runtime_id, handle_id=request.handle_id)
        else:
            require(runtime_id=request.runtime_id)
        return await self.service.readable(request.runtime_id, tenant())

    @edge
    async def CreateRuntime(self, request: pb.CreateRuntimeRequest, context: Context) -> pb.CreateRuntimeResponse:
        agents, found = self.definitions.decode(tenant(), request.agents)
        options = convert.options_from_proto(request.options)
        key = request_key(request)
        runtime_id = await self.service.create_runtime(request.runtime_id, agents, found, options, tenant(), key)
        return pb.CreateRuntimeResponse(runtime_id=runtime_id)

    @edge
    async def Spawn(self, request: pb.SpawnRequest, context: Context) -> pb.SpawnResponse:
        key = request_key(request)
        runtime = await self._runtime(request.runtime_id)
        require(agent=request.agent)
        budget = None
        if request.HasField("budget"):
            found: list[FieldViolation] = []
            budget = convert.budget_from_proto(request.budget, "budget", found)
            if found:
                raise InvalidArgument(found)
        handle = await runtime.spawn(request.parent_id or "root", request.agent, budget, key)
        return pb.SpawnResponse(handle_id=handle.id)

    @edge
    async def Post(self, request: pb.PostRequest, context: Context) -> pb.PostResponse:
        found: list[FieldViolation] = []
        trust = convert.trust_from_proto(request.trust, "trust", found)
        if found:
            raise InvalidArgument(found)
        key = request_key(request)
        runtime = await self._handle_target(request)
        size = await runtime.post(
            request.handle_id, request.text, request.channel, request.sender, trust, request.coalesce_key, key
        )
        return pb.PostResponse(ok=True, inbox_size=size)

    @edge
    async def Wake(self, request: pb.WakeRequest, context: Context) -> pb.WakeResponse:
        key = request_key(request)
        runtime = await self._handle_target(request)
        return pb.WakeResponse(queued=await runtime.wake(request.handle_id, request.prompt, key))

    @edge
    async def Wait(self, request: pb.WaitRequest, context: Context) -> pb.WaitResponse:
        timeout = None
        if request.HasField("timeout"):
            found: list[FieldViolation] = []
            timeout = convert.duration_seconds(request.timeout, "timeout", found)
            if timeout is not None and timeout < 0:
                found.append(FieldViolation("timeout", "must not be negative"))
            elif timeout is not None and timeout > MAX_WAIT_TIMEOUT:
                found.append(FieldViolation("timeout", f"must be at most {MAX_WAIT_TIMEOUT / 3600:g} hours; Wait again after it"))
            if found:
                raise InvalidArgument(found)
        require(runtime_id=request.runtime_id, handle_id=request.handle_id)
        runtime = await self.service.awaitable(request.runtime_id, tenant(), request.handle_id)
        result = await runtime.wait(request.handle_id, timeout)
        await convert.prepare_output(result)
        return pb.WaitResponse(result=convert.result_to_proto(result))

    @edge
    async def Resume(self, request: pb.ResumeRequest, context: Context) -> pb.ResumeResponse:
        key = request_key(request)
        runtime = await self._runtime(request.runtime_id)
        require(**{"answer.id": request.answer.id})
        result = await runtime.resume(convert.answer_from_proto(request.answer), request=key)
        await convert.prepare_output(result)
        return pb.ResumeResponse(result=convert.result_to_proto(result))

    @edge
    async def Interrupt(self, request: pb.InterruptRequest, context: Context) -> pb.InterruptResponse:
        key = request_key(request)
        runtime = await self._handle_target(request)
        return pb.InterruptResponse(interrupted=await runtime.interrupt(request.handle_id, key))

    @edge
    async def Close(self, request: pb.CloseRequest, context: Context) -> pb.CloseResponse:
        grace = None
        if request.HasField("grace"):
            found: list[FieldViolation] = []
            grace = convert.duration_seconds(request.grace, "grace", found)
            if grace is not None and not 0 <= grace <= MAX_CLOSE_GRACE:
                found.append(FieldViolation("grace", f"must be between 0 and {MAX_CLOSE_GRACE:g}s"))
            if found:
                raise InvalidArgument(found)
        key = request_key(request)
        runtime = await self._handle_target(request)
        return pb.CloseResponse(closed_handle_ids=await runtime.close(request.handle_id, request.force, grace, key))

    @edge
    async def Inspect(self, request: pb.InspectRequest, context: Context) -> pb.InspectResponse:
        runtime = await self._readable(request)
        source, cut = runtime.tree.origin or ("", 0)
        view = convert.handle_to_proto(runtime.inspect(request.handle_id))
        return pb.InspectResponse(handle=view, forked_from=source, fork_seq=cut)

    @edge
    async def List(self, request: pb.ListRequest, context: Context) -> pb.ListResponse:
        runtime = await self._readable(request, handle=False)
        views = [convert.handle_to_proto(snapshot) for snapshot in runtime.list_handles()]
        handles, next_token = paging.page(
            views,
            page_size=request.page_size,
            page_token=request.page_token,
            scope=("List", runtime.id),
            size_of=lambda view: view.ByteSize(),
            byte_budget=self.page_bytes,
        )
        return pb.ListResponse(handles=handles, next_page_token=next_token)

    @edge
    async def GetTranscript(self, request: pb.GetTranscriptRequest, context: Context) -> pb.GetTranscriptResponse:
        runtime = await self._readable(request)
        transcript = runtime.transcript(request.handle_id)
        converted: dict[int, pb.Message] = {}

        def proto(index: int) -> pb.Message:
            if index not in converted:
                converted[index] = convert.message_to_proto(transcript[index])
            return converted[index]

        indexes, next_token = paging.page(
            range(len(transcript)),
            page_size=request.page_size,
            page_token=request.page_token,
            scope=("GetTranscript", runtime.id, request.handle_id),
            size_of=lambda index: proto(index).ByteSize(),
            byte_budget=self.page_bytes,
        )
        return pb.GetTranscriptResponse(messages=[proto(index) for index in indexes], next_page_token=next_token)

    @edge
    async def ListRuntimes(self, request: pb.ListRuntimesRequest, context: Context) -> pb.ListRuntimesResponse:
        if request.page_size < 0:
            raise InvalidArgument([FieldViolation("page_size", "must be >= 0 (0: 100)")])
        limit = min(request.page_size or 100, 1000)
        after = paging.cursor(request.page_token, ("ListRuntimes", tenant()))
        rows = await self.service.list_runtimes(tenant(), after, limit + 1, request.forks_of)
        page = rows[:limit]
        response = pb.ListRuntimesResponse(runtimes=[convert.runtime_summary(row) for row in page])
        if len(rows) > limit:
            last = page[-1]
            response.next_page_token = paging.cursor_token((last.created_at, last.runtime_id), ("ListRuntimes", tenant()))
        return response

    @edge
    async def DeleteRuntime(self, request: pb.DeleteRuntimeRequest, context: Context) -> pb.DeleteRuntimeResponse:
        key = request_key(request)
        require(runtime_id=request.runtime_id)
        await self.service.delete_runtime(request.runtime_id, request.force, tenant(), key)
        return pb.DeleteRuntimeResponse()

    async def Watch(self, request: pb.WatchRequest, context: Context) -> AsyncIterator[pb.WatchResponse]:
        """Events after `after_seq`. On replicas the stream follows its runtime: from the owner
        (forwarded), or here once this replica runs it; when the owner dies or hands the
        runtime over, it goes on from the last event sent, so the caller sees no gap and no
        event twice."""
        try:
            current_caller.set(await self.authenticate(context, "Watch"))
            verified = time.monotonic()
            refuse_undecodable(request)
            require(runtime_id=request.runtime_id)
            seen = request.after_seq
            missed: float | None = None
            attempt = 0
            while True:
                try:
                    runtime = await self.service.loaded(request.runtime_id, tenant())
                    if seen < 0:
                        raise InvalidArgument([FieldViolation("after_seq", "must be >= 0")])
                    if seen > runtime.events.last_seq:  # a seq from elsewhere would wait for ever
                        raise InvalidArgument(
                            [
                                FieldViolation(
                                    "after_seq",
                                    f"is past the runtime's last event ({runtime.events.last_seq}); "
                                    "Watch from 0 or from a seq this runtime sent",
                                )
                            ]
                        )
                    durable = 0  # events up to here are known durable: one flush covers every event appended before it
                    # Counted where the runtime is followed (what the stream holds is here), not
                    # where a replica forwards it from: a forwarded stream counts once.
                    with self.service.open_stream("watch_streams", tenant()):
                        most = BATCH if request.batch else 1
                        async for item in runtime.events.follow_batches(seen, request.deltas, most):
                            if isinstance(item, Delta):
                                # Not journaled: nothing to acknowledge. A reconnect gets its turn again.
                                verified = await self._verified_again(context, "Watch", verified)
                                yield pb.WatchResponse(delta=convert.delta_to_proto(item))
                                continue
                            last = item[-1].seq
                            if last > durable:  # a watcher never sees an event a crash could lose
                                appended = runtime.events.published_seq
                                await self.service.acknowledge(runtime.key)
                                durable = max(appended, last)
                            attempt, missed = 0, None
                            verified = await self._verified_again(context, "Watch", verified)
                            if not request.batch:
                                seen = last
                                yield pb.WatchResponse(event=await event_to_proto(item[0]))
                                continue
                            for response in await batched(item, self.page_bytes):
                                yield response
                                seen = response.events[-1].seq
                    return
                except OwnedElsewhere as moved:
                    metadata = metadata_of(context)
                    if self.forwarder is None or forwarded(metadata):
                        raise moving_between_replicas(request.runtime_id) from None
                    if moved.address:
                        onward = pb.WatchRequest(
                            runtime_id=request.runtime_id, after_seq=seen, deltas=request.deltas, batch=request.batch
                        )
                        try:
                            async for response in self.forwarder.stream(
                                "Watch", onward, moved.address, metadata, context.time_remaining()
                            ):
                                if response.HasField("delta"):
                                    verified = await self._verified_again(context, "Watch", verified)
                                    yield response
                                    continue
                                seen = response.events[-1].seq if response.events else response.event.seq
                                attempt, missed = 0, None
                                verified = await self._verified_again(context, "Watch", verified)
                                yield response
                            return
                        except PeerUnavailable:
                            pass
                except Unavailable as error:
                    if (
                        isinstance(error, StoreBroken)  # this replica serves nothing more: the caller goes elsewhere
                        or self.service.draining
                        or not self.service.leases.shared
                        or forwarded(metadata_of(context))
                    ):
                        raise
                    # This replica's copy stopped (its lease moved): follow the runtime to its new owner.
                missed = time.monotonic() if missed is None else missed
                await self._pause(attempt, missed, context, request.runtime_id)
                attempt += 1
        except Relayed as relayed:
            await context.abort(relayed.code, relayed.details, relayed.trailing)
        except DomainError as error:
            await context.abort_with_status(to_grpc_status(error))  # type: ignore[arg-type]

    async def ServeTools(
        self, requests: AsyncIterator[pb.ServeToolsRequest | Undecodable], context: Context
    ) -> AsyncIterator[pb.ServeToolsResponse]:
        """A host serving worker tools (tools/workers.py): its registration, then the calls of
        its queue as agents make them, while its outputs are read alongside."""
        worker: WorkerStream | None = None
        reader: asyncio.Task[None] | None = None
        held = contextlib.ExitStack()  # its place in the tenant's quota of streams, given back last
        try:
            current_caller.set(await self.authenticate(context, "ServeTools"))
            verified = time.monotonic()
            first = await anext(aiter(requests), None)
            if first is None:
                return
            registration = checked_registration(decoded(first))
            held.enter_context(self.service.open_stream("worker_streams", tenant()))
            worker = await self.workers.connect(
                tenant(), registration.queue, list(registration.tools), registration.max_concurrent_calls or 1
            )
            audit_call("ServeTools", registration, "OK")
            yield pb.ServeToolsResponse(registered=pb.WorkerRegistered(worker_id=worker.id))
            reader = asyncio.ensure_future(read_outputs(requests, worker, self.max_text_bytes))
            # When the host's side ends (or breaks a rule), the send loop is told like a shutdown.
            reader.add_done_callback(lambda _: worker.outbox.put_nowait(None))
            while True:
                try:
                    dispatch = await asyncio.wait_for(worker.outbox.get(), STREAM_RECHECK_SECONDS)
                except TimeoutError:  # idle: a revoked worker leaves before a call is given to it
                    verified = await self._verified_again(context, "ServeTools", verified)
                    continue
                if dispatch is None:  # the host closed its side, sent what it may not, or the server stops
                    if reader.done() and not reader.cancelled():
                        reader.result()  # an InvalidArgument of the host's: its status
                    return
                # Refused, the call it took is never sent: leaving, the worker gives it back to the pool.
                verified = await self._verified_again(context, "ServeTools", verified)
                if not worker.outbox.sending(dispatch):
                    continue  # withdrawn while the credential was checked (its deadline passed, or its turn stopped)
                yield pb.ServeToolsResponse(call=convert.worker_call_to_proto(dispatch))
        except DomainError as error:
            await context.abort_with_status(to_grpc_status(error))  # type: ignore[arg-type]
        finally:
            try:
                if reader is not None:
                    reader.cancel()
                if worker is not None:
                    await self.workers.disconnect(worker)  # what it still holds is in doubt
            finally:
                held.close()


def add_to_server(servicer: AgentRuntimeServicer, server: grpc.aio.Server) -> None:
    """Registers the service with decoders that never fail: a request that does not decode
    reaches the edge as Undecodable and gets INVALID_ARGUMENT, not UNKNOWN and a traceback."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in SERVICE.methods:
        request_type: type[ProtoMessage] = getattr(pb, method.input_type.name)
        response_type: type[ProtoMessage] = getattr(pb, method.output_type.name)
        behaviour = getattr(servicer, method.name)
        if method.client_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            behaviour, request_deserializer=decoder(request_type), response_serializer=response_type.SerializeToString
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
