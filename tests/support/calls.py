"""One verb and what it tells, for tests that drive a runtime call by call: Wake, a handle's view
(Inspect), Resume's result, the BadRequest fields of a refusal, and a runtime's events from the
first until one a predicate accepts; a handle's state, and a bounded wait for one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2

from tests.support.build import status_details
from tests.support.poll import eventually

# A stub on a grpc.aio channel: its calls are awaited. The async stub's type exists only in the
# generated .pyi; at run time the one class is AgentRuntimeStub.
if TYPE_CHECKING:
    Stub: TypeAlias = pb_grpc.AgentRuntimeAsyncStub
else:
    Stub = pb_grpc.AgentRuntimeStub


async def wake(stub: Stub, runtime_id: str, handle_id: str, prompt: str = "") -> None:
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=prompt))


async def handle_view(stub: Stub, runtime_id: str, handle_id: str) -> pb.HandleView:
    return (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle


async def resume(stub: Stub, runtime_id: str, answer: pb.Answer, timeout: float = 60) -> pb.TaskResult:
    return (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer), timeout=timeout)).result


def bad_request_fields(error: grpc.aio.AioRpcError) -> list[str]:
    """The BadRequest field violations' paths an error carries."""
    return [
        violation.field
        for detail in status_details(error)
        if isinstance(detail, error_details_pb2.BadRequest)
        for violation in detail.field_violations
    ]


async def events_until(stub: Stub, runtime_id: str, stop: Callable[[pb.Event], bool]) -> list[pb.Event]:
    """A runtime's events from the first, until (and with) the one `stop` accepts."""
    events: list[pb.Event] = []
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=0))
    async with asyncio.timeout(20):
        async for response in call:
            events.append(response.event)
            if stop(response.event):
                call.cancel()
                break
    return events


def is_result_of(handle_id: str) -> Callable[[pb.Event], bool]:
    return lambda event: event.handle_id == handle_id and event.WhichOneof("payload") == "result"


async def state_of(stub: Stub, runtime_id: str, handle_id: str) -> pb.HandleState.ValueType:
    return (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle.state


async def until_state(stub: Stub, runtime_id: str, handle_id: str, state: pb.HandleState.ValueType) -> None:
    """Polls Inspect (an RPC: `until` takes a plain condition) until the handle is in `state`."""

    async def reached() -> bool:
        return await state_of(stub, runtime_id, handle_id) == state

    await eventually(reached, f"{handle_id} to reach {pb.HandleState.Name(state)}", timeout=20)
