"""The gRPC edge: check required fields, convert, hand off to the domain, convert back."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from ..domain.errors import DomainError, FieldViolation, InvalidArgument
from ..domain.runtime import Runtime
from ..domain.service import RuntimeService
from . import convert
from .errors import to_grpc_status

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Req, Context], Awaitable[Resp]]


def _edge(method: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Maps a refused request to its canonical status; nothing else escapes as INTERNAL quietly."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Req, context: Context) -> Resp:
        try:
            response = await method(self, request, context)
            await self.service.acknowledge()
            return response
        except DomainError as error:
            await context.abort_with_status(to_grpc_status(error))  # type: ignore[arg-type]
            raise  # unreachable: abort raises
        except Exception:
            # Our bug, not the caller's: log it whole, answer INTERNAL without internals.
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed inside the server; see the server log")
            raise

    return wrapper


def _require(**fields: str) -> None:
    missing = [FieldViolation(name, "is required") for name, value in fields.items() if not value]
    if missing:
        raise InvalidArgument(missing)


class AgentRuntimeServicer(pb_grpc.AgentRuntimeServicer):
    def __init__(self, service: RuntimeService) -> None:
        self.service = service

    async def _runtime(self, runtime_id: str) -> Runtime:
        _require(runtime_id=runtime_id)
        return await self.service.runtime(runtime_id)

    async def _handle_target(self, request: Any) -> Runtime:
        _require(runtime_id=request.runtime_id, handle_id=request.handle_id)
        return await self.service.runtime(request.runtime_id)

    @_edge
    async def CreateRuntime(self, request: pb.CreateRuntimeRequest, context: Context) -> pb.CreateRuntimeResponse:
        agents = convert.agents_from_proto(list(request.agents))
        runtime = await self.service.create_runtime(request.runtime_id, agents)
        return pb.CreateRuntimeResponse(runtime_id=runtime.id)

    @_edge
    async def Spawn(self, request: pb.SpawnRequest, context: Context) -> pb.SpawnResponse:
        runtime = await self._runtime(request.runtime_id)
        _require(agent=request.agent)
        budget = convert.budget_from_proto(request.budget) if request.HasField("budget") else None
        handle = await runtime.spawn(request.parent_id or "root", request.agent, budget)
        return pb.SpawnResponse(handle_id=handle.id)

    @_edge
    async def Post(self, request: pb.PostRequest, context: Context) -> pb.PostResponse:
        runtime = await self._handle_target(request)
        size = await runtime.post(request.handle_id, request.text, request.channel, request.sender)
        return pb.PostResponse(ok=True, inbox_size=size)

    @_edge
    async def Wake(self, request: pb.WakeRequest, context: Context) -> pb.WakeResponse:
        runtime = await self._handle_target(request)
        return pb.WakeResponse(queued=await runtime.wake(request.handle_id, request.prompt))

    @_edge
    async def Wait(self, request: pb.WaitRequest, context: Context) -> pb.WaitResponse:
        runtime = await self._handle_target(request)
        timeout = None
        if request.HasField("timeout"):
            timeout = request.timeout.ToTimedelta().total_seconds()
            if timeout < 0:
                raise InvalidArgument([FieldViolation("timeout", "must not be negative")])
        result = await runtime.wait(request.handle_id, timeout)
        return pb.WaitResponse(result=convert.result_to_proto(result))

    @_edge
    async def Resume(self, request: pb.ResumeRequest, context: Context) -> pb.ResumeResponse:
        runtime = await self._runtime(request.runtime_id)
        _require(**{"answer.id": request.answer.id})
        result = await runtime.resume(convert.answer_from_proto(request.answer))
        return pb.ResumeResponse(result=convert.result_to_proto(result))

    @_edge
    async def Interrupt(self, request: pb.InterruptRequest, context: Context) -> pb.InterruptResponse:
        runtime = await self._handle_target(request)
        return pb.InterruptResponse(interrupted=await runtime.interrupt(request.handle_id))

    @_edge
    async def Close(self, request: pb.CloseRequest, context: Context) -> pb.CloseResponse:
        runtime = await self._handle_target(request)
        return pb.CloseResponse(closed_handle_ids=await runtime.close(request.handle_id, request.force))

    @_edge
    async def Inspect(self, request: pb.InspectRequest, context: Context) -> pb.InspectResponse:
        runtime = await self._handle_target(request)
        return pb.InspectResponse(handle=convert.handle_to_proto(runtime.inspect(request.handle_id)))

    @_edge
    async def List(self, request: pb.ListRequest, context: Context) -> pb.ListResponse:
        runtime = await self._runtime(request.runtime_id)
        return pb.ListResponse(handles=[convert.handle_to_proto(snapshot) for snapshot in runtime.list_handles()])

    @_edge
    async def GetTranscript(self, request: pb.GetTranscriptRequest, context: Context) -> pb.GetTranscriptResponse:
        runtime = await self._handle_target(request)
        return pb.GetTranscriptResponse(messages=[convert.message_to_proto(m) for m in runtime.transcript(request.handle_id)])

    async def Watch(self, request: pb.WatchRequest, context: Context) -> AsyncIterator[pb.WatchResponse]:
        try:
            runtime = await self._runtime(request.runtime_id)
            if request.after_seq < 0:
                raise InvalidArgument([FieldViolation("after_seq", "must be >= 0")])
            async for event in runtime.events.follow(request.after_seq):
                await self.service.acknowledge()  # a watcher never sees an event a crash could lose
                yield pb.WatchResponse(event=convert.event_to_proto(event))
        except DomainError as error:
            await context.abort_with_status(to_grpc_status(error))  # type: ignore[arg-type]
