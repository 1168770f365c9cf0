"""Short builders for the protos tests send, and a few RPC helpers."""

from __future__ import annotations

from typing import Any

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.protobuf import duration_pb2, struct_pb2
from google.rpc import error_details_pb2, status_pb2


def duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


def http_tool(name: str, url: str, schema: dict[str, Any] | None = None) -> pb.ToolDef:
    tool = pb.ToolDef(name=name, description=f"the {name} tool", http=pb.HttpTool(url=url))
    if schema is not None:
        tool.input_schema.update(schema)
    return tool


def agent(name: str, model: str = "", **fields: Any) -> pb.AgentDef:
    return pb.AgentDef(name=name, description=f"the {name} agent", model=model or name, **fields)


async def create(stub: pb_grpc.AgentRuntimeAsyncStub, *agents: pb.AgentDef, runtime_id: str = "") -> str:
    response = await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=list(agents)))
    return response.runtime_id


async def spawn(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, agent_name: str, budget: pb.Budget | None = None) -> str:
    """A top-level handle of `agent_name`."""
    spawned = await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent=agent_name, budget=budget))
    return spawned.handle_id


async def wait(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> pb.TaskResult:
    """The handle's result; a deadline so that a test fails rather than hangs."""
    return (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=60)).result


async def run(
    stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, agent_name: str, prompt: str, budget: pb.Budget | None = None
) -> tuple[str, pb.TaskResult]:
    """Spawn a top-level handle, wake it, wait for its result."""
    handle_id = await spawn(stub, runtime_id, agent_name, budget)
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=prompt))
    return handle_id, await wait(stub, runtime_id, handle_id)


async def transcript(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> list[pb.Message]:
    """The handle's whole transcript, every page of it."""
    messages: list[pb.Message] = []
    token = ""
    while True:
        page = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id, page_token=token))
        messages.extend(page.messages)
        token = page.next_page_token
        if not token:
            return messages


async def views(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str) -> dict[str, pb.HandleView]:
    listed = await stub.List(pb.ListRequest(runtime_id=runtime_id))
    return {view.handle_id: view for view in listed.handles}


def status_details(error: grpc.aio.AioRpcError) -> list[Any]:
    """The google.rpc details packed in the error's trailing metadata."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            found: list[Any] = []
            for detail in status.details:
                for kind in (
                    error_details_pb2.BadRequest,
                    error_details_pb2.ErrorInfo,
                    error_details_pb2.ResourceInfo,
                    error_details_pb2.RetryInfo,
                ):
                    if detail.Is(kind.DESCRIPTOR):
                        unpacked = kind()
                        detail.Unpack(unpacked)
                        found.append(unpacked)
            return found
    return []


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(data)
    return value
