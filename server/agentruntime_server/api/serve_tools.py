"""The ServeTools stream's messages: a worker's registration, checked as a definition is, and
its outputs, each handed to the call it answers (one bad output is that call's error result, not
the stream's end). The stream itself is the servicer's (servicer.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from agentruntime.v1 import agent_runtime_pb2 as pb

from ..domain.definitions.validation import TOOL_NAME, check_worker
from ..domain.errors import FieldViolation, InvalidArgument, shown
from ..domain.vocabulary import ToolResult, WorkerExecutor
from . import convert
from .edge import Undecodable, decoded
from .worker_hub import WorkerStream

log = logging.getLogger(__name__)

MAX_WORKER_TOOLS = 100  # tool names one worker registration may list
MAX_WORKER_CALLS = 1000  # calls one worker may hold at once


async def read_outputs(
    requests: AsyncIterator[pb.ServeToolsRequest | Undecodable], worker: WorkerStream, max_text_bytes: int
) -> None:
    """A worker's outputs, each handed to the call it answers, until the host closes its side."""
    async for received in requests:
        request = decoded(received)
        if request.WhichOneof("message") != "output":
            raise InvalidArgument([FieldViolation("output", "after the registration, send only outputs")])
        output = request.output
        found: list[FieldViolation] = []
        text = convert.tool_output_text(output, "output.structured", found)
        if found:
            # One bad output is that call's error, not the stream's: the worker serves on.
            log.warning("worker %s: its output for a call %s; the call gets an error result", worker.id, found[0].description)
            result = ToolResult(f"the worker's structured output {found[0].description} (JSON has neither)", is_error=True)
        elif len(text.encode()) > max_text_bytes:
            result = ToolResult(f"the worker's output is larger than {max_text_bytes} bytes", is_error=True)
        else:
            result = ToolResult(text, is_error=output.is_error)
        worker.answer(output.call_id, result)  # a late or unknown call's output is dropped


def checked_registration(request: pb.ServeToolsRequest) -> pb.WorkerRegistration:
    """The stream's first request, a worker's registration, checked as a definition is."""
    if request.WhichOneof("message") != "registration":
        raise InvalidArgument([FieldViolation("registration", "the first request must register the worker")])
    registration = request.registration
    found = check_worker(WorkerExecutor(registration.queue, 1.0), "registration")
    if len(registration.tools) > MAX_WORKER_TOOLS:
        found.append(FieldViolation("registration.tools", f"names {len(registration.tools)} tools; at most {MAX_WORKER_TOOLS}"))
    for index, name in enumerate(registration.tools[:MAX_WORKER_TOOLS]):
        if not TOOL_NAME.fullmatch(name):
            found.append(FieldViolation(f"registration.tools[{index}]", f"{shown(name)} is not a tool name"))
    if not 0 <= registration.max_concurrent_calls <= MAX_WORKER_CALLS:
        found.append(FieldViolation("registration.max_concurrent_calls", f"must be between 0 (1) and {MAX_WORKER_CALLS}"))
    if found:
        raise InvalidArgument(found)
    return registration
