"""MCP servers as tool sources (issue 14): a real MCP server built with the official SDK
(MCPServer, FastMCP's name in mcp 2.x) on loopback, a real agentruntime server, a
scripted model over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import uvicorn
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from mcp.server.mcpserver import Context, MCPServer

from tests.support.build import agent, create, run, status_details, transcript
from tests.support.model_server import Reply, ScriptedModelServer, tool_results


class Calc:
    """An MCP server with a few tools, on a loopback port, that a test can stop."""

    def __init__(self) -> None:
        self.meta: list[Any] = []
        server = MCPServer("calc")

        @server.tool()
        def add(a: int, b: int, ctx: Context) -> str:
            """Adds two integers."""
            self.meta.append(dict(ctx.request_context.meta or {}))
            return str(a + b)

        @server.tool()
        def shout(text: str) -> str:
            """Upper-cases text."""
            return text.upper()

        self.app = server.streamable_http_app()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        self.task = asyncio.ensure_future(self.server.serve())
        for _ in range(200):
            if self.server.started:
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the MCP server did not start")

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@pytest.fixture
async def calc() -> AsyncIterator[Calc]:
    made = Calc()
    await made.start()
    yield made
    await made.stop()


def mcp_agent(name: str, *servers: pb.McpServer) -> pb.AgentDef:
    return agent(name, mcp_servers=list(servers))


def call_then_answer(tool: str, arguments: dict[str, Any]) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[(tool, arguments)], tokens=10)
        return Reply(text="done", tokens=10)

    return script


async def test_an_agent_lists_and_calls_an_mcp_servers_tools_with_the_idempotency_key(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, calc: Calc
) -> None:
    model.script("mathematician", call_then_answer("calc__add", {"a": 2, "b": 3}))
    runtime_id = await create(stub, mcp_agent("mathematician", pb.McpServer(name="calc", url=calc.url)))
    handle_id, result = await run(stub, runtime_id, "mathematician", "add")
    assert (result.status, result.tool_calls, result.turns) == (pb.STATUS_DONE, 1, 2)
    advertised = {tool["function"]["name"]: tool["function"] for tool in model.requests[0]["tools"]}
    assert {"calc__add", "calc__shout"} <= set(advertised)
    assert advertised["calc__add"]["description"] == "Adds two integers."
    assert advertised["calc__add"]["parameters"]["required"] == ["a", "b"]
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert (tool_message.content, tool_message.is_error) == ("5", False)
    assert calc.meta == [{"idempotency_key": f"{runtime_id}/{handle_id}/call_1_1"}]


async def test_allowed_tools_filters_and_an_unknown_one_is_refused(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, calc: Calc
) -> None:
    model.script("shouter", call_then_answer("calc__shout", {"text": "hey"}))
    only = pb.McpServer(name="calc", url=calc.url, allowed_tools=["shout"])
    runtime_id = await create(stub, mcp_agent("shouter", only))
    await run(stub, runtime_id, "shouter", "go")
    names = {tool["function"]["name"] for tool in model.requests[0]["tools"]}
    assert "calc__shout" in names and "calc__add" not in names
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, mcp_agent("shouter", pb.McpServer(name="calc", url=calc.url, allowed_tools=["divide"])))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [bad_request] = status_details(refused.value)
    [violation] = bad_request.field_violations
    assert violation.field == "agents[0].mcp_servers[0].allowed_tools[0]" and "lists no tool 'divide'" in violation.description


async def test_an_unreachable_or_denied_server_refuses_the_runtime_naming_it(stub: pb_grpc.AgentRuntimeStub) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens here once the socket closes
    cases = [
        (pb.McpServer(name="gone", url=f"http://127.0.0.1:{closed}/mcp"), "MCP server 'gone' could not be listed"),
        (pb.McpServer(name="meta", url="http://169.254.169.254/mcp"), "not allowed by the egress policy"),
    ]
    for server, says in cases:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await create(stub, mcp_agent("user", server))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in (refused.value.details() or ""), refused.value.details()
    listed = await stub.ListRuntimes(pb.ListRuntimesRequest())
    assert not listed.runtimes  # nothing was created


async def test_a_bad_server_definition_is_refused_before_any_connection(stub: pb_grpc.AgentRuntimeStub) -> None:
    bad = pb.McpServer(name="9lives", url="ftp://example.test/mcp", headers={"Bad Header": "x"})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, mcp_agent("user", bad))
    [bad_request] = status_details(refused.value)
    fields = [violation.field for violation in bad_request.field_violations]
    assert fields[:2] == ["agents[0].mcp_servers[0].name", "agents[0].mcp_servers[0].url"], fields
    assert any(field.startswith("agents[0].mcp_servers[0].headers[") for field in fields), fields


async def test_a_server_gone_mid_run_gives_an_error_result_not_a_stuck_run(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, calc: Calc
) -> None:
    model.script("mathematician", call_then_answer("calc__add", {"a": 1, "b": 1}))
    runtime_id = await create(stub, mcp_agent("mathematician", pb.McpServer(name="calc", url=calc.url)))
    await calc.stop()  # listed at create; gone by the call
    handle_id, result = await run(stub, runtime_id, "mathematician", "add")
    assert (result.status, result.text) == (pb.STATUS_DONE, "done")
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error and "MCP server 'calc' failed" in tool_message.content
