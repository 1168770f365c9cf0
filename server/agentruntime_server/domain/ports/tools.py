"""The tool seams: http tools, worker tools, MCP servers, the egress policy, the schema judge.
Implementations: tools/, process/schema_judges.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..vocabulary import (
    Answer,
    HttpExecutor,
    McpExecutor,
    McpServerSpec,
    ToolCall,
    ToolResult,
    ToolSuspension,
    WorkerExecutor,
)


class CallInDoubt(Exception):
    """An attempt of a call was cut off once its request may have reached the tool (the
    connection was lost, or the deadline passed, after the request was sent): the call may or
    may not have taken effect. The text says how, and is shown to the model and the host."""


class CallNotSent(Exception):
    """An attempt of a call reached nothing (no connection, or one lost before any byte of the
    request was sent): the tool cannot have acted on it. The text is the error result the
    model is shown, unless an earlier attempt of the call was cut off (CallInDoubt)."""


class HttpToolRunner(Protocol):
    async def run(
        self, executor: HttpExecutor, arguments_json: str, idempotency_key: str, answer: Answer | None = None
    ) -> ToolResult | ToolSuspension:
        """One attempt: the call's result, or the Request it suspends on (HTTP 202); raises
        CallInDoubt or CallNotSent when no answer came. `answer`: the host's answer to the
        Request the previous attempt of this call suspended on."""
        ...


class WorkerLost(Exception):
    """The worker running a call went away, or kept it past its deadline: the call may or
    may not have taken effect (it is in doubt)."""

    def __init__(self, message: str, worker_id: str = "") -> None:
        super().__init__(message)
        self.worker_id = worker_id


class WorkerToolRunner(Protocol):
    async def run(
        self,
        tenant: str,
        executor: WorkerExecutor,
        call: ToolCall,
        key: str,
        runtime_id: str,
        handle_id: str,
        lost: Sequence[str] = (),
    ) -> ToolResult:
        """The output of a worker serving the executor's queue (of the tenant); an error
        result when no worker took the call within its timeout (one that says the call is in
        doubt when a worker took it before: `lost` names the workers whose WorkerLost this
        attempt follows); WorkerLost when the worker that took it did not answer (it may have
        run it)."""
        ...


@dataclass(frozen=True)
class Dispatch:
    """A call on its way to a worker (the WorkerToolRunner hands it to the host serving its queue):
    what the edge sends as a WorkerCall."""

    id: str
    call: ToolCall
    key: str
    runtime_id: str
    handle_id: str
    deadline: float  # time.time()


class NoWorkers:
    """A runtime with no ServeTools edge (tests of the domain): nobody serves any queue."""

    async def run(
        self,
        tenant: str,
        executor: WorkerExecutor,
        call: ToolCall,
        key: str,
        runtime_id: str,
        handle_id: str,
        lost: Sequence[str] = (),
    ) -> ToolResult:
        return ToolResult(f"no worker serves queue {executor.queue!r}", is_error=True)


@dataclass(frozen=True)
class McpTool:
    """A tool an MCP server lists."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None  # what its structuredContent must match


@dataclass(frozen=True)
class StructuredContent:
    """An MCP tool's structured content, for a tool that listed an output schema: the domain
    checks it against that schema (schema_checks.py) before the model reads its JSON text."""

    server: str
    value: Any
    text: str  # its JSON, as the model reads it


class McpError(Exception):
    """An MCP server could not be reached or answered wrongly; the message never holds a secret."""


class McpClient(Protocol):
    async def list_tools(self, server: McpServerSpec) -> list[McpTool]:
        """Every tool the server lists (McpError if it cannot be had)."""
        ...

    async def call(self, executor: McpExecutor, arguments: dict[str, Any], key: str) -> ToolResult | StructuredContent:
        """The call's result (`tools/call`, the idempotency key in `_meta`); a server that
        cannot be reached or fails gives an error result. A tool with an output schema that
        answers with structured content gives it unjudged."""
        ...


class NoMcp:
    """No MCP client (tests of the domain): no server can be reached."""

    async def list_tools(self, server: McpServerSpec) -> list[McpTool]:
        raise McpError("this server reaches no MCP server")

    async def call(self, executor: McpExecutor, arguments: dict[str, Any], key: str) -> ToolResult:
        return ToolResult("this server reaches no MCP server", is_error=True)


class UrlPolicy(Protocol):
    def url_refusal(self, url: str) -> str | None:
        """Why no connection may be made to `url` whatever DNS answers (its host is an IP
        literal the egress policy refuses), or None. Checked at CreateRuntime for every URL a
        definition makes the server connect to; host names are judged when resolved."""
        ...


class AnyUrl:
    """No egress policy (tests of the domain): every URL may be tried."""

    def url_refusal(self, url: str) -> str | None:
        return None


class SchemaJudge(Protocol):
    async def problem(self, tenant: str, schema: str, instance: str) -> str | None:
        """Why `instance` (JSON text) fails `schema` (the JSON text of a schema the definitions
        check accepted): jsonschema's best match, or None when it matches, judged off the event
        loop (process/schema_judges.py). Raises CheckNotDone with the reason when it could not
        judge (its time budget spent, the schema not applicable)."""
        ...
