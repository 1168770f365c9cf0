"""MCP servers as tool sources (issue 14): a real MCP server built with the official SDK
(MCPServer, FastMCP's name in mcp 2.x) on loopback, a real agentruntime server, a
scripted model over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator

import grpc
import pytest
import trustme
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, run, status_details, transcript
from tests.support.dns import REBOUND, RebindingDns
from tests.support.mcp import Calc, calc, call_then_answer
from tests.support.model_server import ScriptedModelServer
from tests.support.servers import serve

__all__ = ["calc"]  # fixtures of tests/support, used here


def mcp_agent(name: str, *servers: pb.McpServer) -> pb.AgentDef:
    return agent(name, mcp_servers=list(servers))


async def test_an_agent_lists_and_calls_an_mcp_servers_tools_with_the_idempotency_key(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, calc: Calc
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
    # The SDK lists an output schema for the str it returns ({"result": ...}): the model reads the
    # structured content, checked against it, as JSON (docs/typed-results.md#mcp-tools).
    assert (tool_message.content, tool_message.is_error) == ('{"result": "5"}', False)
    assert calc.meta == [{"idempotency_key": f"{runtime_id}/{handle_id}/call_1_1"}]


async def test_allowed_tools_filters_and_an_unknown_one_is_refused(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, calc: Calc
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


async def test_an_unreachable_or_denied_server_refuses_the_runtime_naming_it(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens here once the socket closes
    cases = [
        (pb.McpServer(name="gone", url=f"http://127.0.0.1:{closed}/mcp"), "MCP server 'gone' could not be listed"),
        (pb.McpServer(name="meta", url="http://169.254.169.254/mcp"), "url: refused by the egress policy"),
    ]
    for server, says in cases:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await create(stub, mcp_agent("user", server))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in (refused.value.details() or ""), refused.value.details()
    listed = await stub.ListRuntimes(pb.ListRuntimesRequest())
    assert not listed.runtimes  # nothing was created


async def test_a_bad_server_definition_is_refused_before_any_connection(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    bad = pb.McpServer(name="9lives", url="ftp://example.test/mcp", headers={"Bad Header": "x"})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, mcp_agent("user", bad))
    [bad_request] = status_details(refused.value)
    fields = [violation.field for violation in bad_request.field_violations]
    assert fields[:2] == ["agents[0].mcp_servers[0].name", "agents[0].mcp_servers[0].url"], fields
    assert any(field.startswith("agents[0].mcp_servers[0].headers[") for field in fields), fields


async def test_a_server_gone_mid_run_gives_an_error_result_not_a_stuck_run(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, calc: Calc
) -> None:
    model.script("mathematician", call_then_answer("calc__add", {"a": 1, "b": 1}))
    runtime_id = await create(stub, mcp_agent("mathematician", pb.McpServer(name="calc", url=calc.url)))
    await calc.stop()  # listed at create; gone by the call
    handle_id, result = await run(stub, runtime_id, "mathematician", "add")
    assert (result.status, result.text) == (pb.STATUS_DONE, "done")
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error and "MCP server 'calc' failed" in tool_message.content


# ---- DNS rebinding: the address the egress policy judged is the one connected to ----


@contextlib.asynccontextmanager
async def denying_loopback(model: ScriptedModelServer) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    """A server whose egress policy denies 127.0.0.1 (and only it: 127.0.0.2 and .3 are allowed)."""
    async with serve(
        llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", tool_egress_deny=["127.0.0.1/32"]
    ) as served:
        yield served.stub


@pytest.fixture
async def internal() -> AsyncIterator[Calc]:
    """An MCP server on the denied 127.0.0.1: what a rebound name points at."""
    made = Calc("127.0.0.1")
    await made.start()
    yield made
    await made.stop()


async def test_a_name_rebound_between_the_check_and_the_connect_is_not_listed(
    model: ScriptedModelServer, internal: Calc, monkeypatch: pytest.MonkeyPatch
) -> None:
    dns = RebindingDns(monkeypatch)
    dns.rebind()
    async with denying_loopback(model) as stub:
        rebound = pb.McpServer(name="calc", url=f"http://{REBOUND}:{internal.port}/mcp")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await create(stub, mcp_agent("user", rebound))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "MCP server 'calc' could not be listed" in (refused.value.details() or "")
        dns.answers = ["127.0.0.1"]
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await create(stub, mcp_agent("user", rebound))
        assert "refused by the egress policy: rebinding.test resolves to an address it refuses" in (
            denied.value.details() or ""
        ), denied.value.details()
    assert internal.requests == 0


async def test_a_name_rebound_after_the_listing_is_not_called(
    model: ScriptedModelServer, internal: Calc, monkeypatch: pytest.MonkeyPatch
) -> None:
    public = Calc("127.0.0.2", internal.port)  # what the name honestly resolves to: allowed
    await public.start()
    try:
        dns = RebindingDns(monkeypatch)
        dns.answers = ["127.0.0.2"]
        model.script("mathematician", call_then_answer("calc__add", {"a": 2, "b": 3}))
        async with denying_loopback(model) as stub:
            server = pb.McpServer(name="calc", url=f"http://{REBOUND}:{internal.port}/mcp")
            runtime_id = await create(stub, mcp_agent("mathematician", server))
            dns.rebind()
            handle_id, result = await run(stub, runtime_id, "mathematician", "add")
            assert (result.status, result.text) == (pb.STATUS_DONE, "done")
            [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
        assert tool_message.is_error and "MCP server 'calc' failed" in tool_message.content
        assert "sk-test" not in tool_message.content
        assert public.requests > 0 and public.meta == []
        assert public.hosts == {f"{REBOUND}:{internal.port}"}  # the name, not the address connected to
        assert internal.requests == 0
    finally:
        await public.stop()


async def test_tls_to_an_mcp_server_names_its_host_not_the_checked_address(
    stub: pb_grpc.AgentRuntimeAsyncStub, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection goes to the address the policy judged; TLS still asks for and verifies the name."""
    caplog.set_level(logging.INFO, logger="agentruntime_server.tools.mcp")
    names: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("localhost").configure_cert(context)  # a CA the server's client does not trust
    context.sni_callback = lambda _socket, name, _context: names.append(name)
    listener = await asyncio.start_server(lambda _reader, writer: writer.close(), "127.0.0.1", 0, ssl=context)
    port = listener.sockets[0].getsockname()[1]
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await create(stub, mcp_agent("user", pb.McpServer(name="tls", url=f"https://localhost:{port}/mcp")))
    finally:
        listener.close()
        await listener.wait_closed()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A TLS listener says no more than a closed port (tests/api/test_egress_forms.py); the log has the cause.
    assert "it could not be reached or did not answer as an MCP server" in (refused.value.details() or "")
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert names == ["localhost"]


async def test_an_mcp_tools_structured_content_reaches_the_model_as_json_checked_against_its_output_schema(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, calc: Calc
) -> None:
    model.script("counter", call_then_answer("calc__stats", {"numbers": [2, 3, 5]}))
    runtime_id = await create(stub, mcp_agent("counter", pb.McpServer(name="calc", url=calc.url, allowed_tools=["stats"])))
    handle_id, result = await run(stub, runtime_id, "counter", "count")
    assert result.status == pb.STATUS_DONE
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert (json.loads(tool_message.content), tool_message.is_error) == ({"count": 3, "total": 10}, False)
