"""Every byte from a tenant's MCP server is bounded (issue 27): a listing is read to 4 MiB on
the wire (all pages together), a call's reply to 4 x AGENTRUNTIME_MAX_TEXT_BYTES + 64 KiB
and its text to AGENTRUNTIME_MAX_TEXT_BYTES; past them the connection is dropped and the
CreateRuntime refused, or the call an error result, at once (not at the server's timeout).
The MCP server is the test's (tests/support/huge_mcp.py), answering 50 MB as JSON or SSE."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, duration, run, status_details, transcript
from tests.support.huge_mcp import HugeMcp
from tests.support.mcp import call_then_answer
from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.probe import STALLED, InspectProbe
from tests.support.process import ServerProcess

KIB = 1024
MIB = 1024 * KIB
LISTING_LIMIT = 4 * MIB
TEXT_LIMIT = 256 * KIB  # AGENTRUNTIME_MAX_TEXT_BYTES's default
HUGE = 50 * MIB
PROMPTLY = 3.0  # seconds; the MCP server's timeout is 20


@contextlib.asynccontextmanager
async def huge_mcp(**options: Any) -> AsyncIterator[HugeMcp]:
    server = HugeMcp(**options)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def user_of(server: HugeMcp, **fields: Any) -> pb.AgentDef:
    return agent("user", mcp_servers=[pb.McpServer(name="huge", url=server.url, timeout=duration(20), **fields)])


async def refusal(stub: pb_grpc.AgentRuntimeAsyncStub, *definitions: pb.AgentDef) -> tuple[grpc.aio.AioRpcError, float]:
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, *definitions)
    return refused.value, time.monotonic() - started


def the_violation(error: grpc.aio.AioRpcError) -> Any:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    [bad_request] = status_details(error)
    [violation] = bad_request.field_violations
    return violation


# ---- listings ----


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_a_50_mb_listing_is_refused_at_once_naming_the_server_and_read_no_further(
    stub: pb_grpc.AgentRuntimeAsyncStub, sse: bool
) -> None:
    async with huge_mcp(pages=[HUGE], sse=sse) as server:
        error, seconds = await refusal(stub, user_of(server))
        violation = the_violation(error)
        assert violation.field == "agents[0].mcp_servers[0]"
        assert violation.description == (
            "MCP server 'huge' could not be listed: its listing is larger than the limit of 4,194,304 bytes"
        )
        assert seconds < PROMPTLY, seconds
        await until(lambda: server.cut["tools/list"] == 1, "the listing's connection to be dropped")
        assert server.sent["tools/list"] < 16 * MIB  # the limit, and what the sockets' buffers took
    assert not (await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compression_bomb_of_a_listing_is_counted_decoded(stub: pb_grpc.AgentRuntimeAsyncStub, encoding: str) -> None:
    async with huge_mcp(pages=[HUGE], encoding=encoding) as server:
        error, seconds = await refusal(stub, user_of(server))
        assert "its listing is larger than the limit of 4,194,304 bytes" in the_violation(error).description
        assert seconds < PROMPTLY, seconds
        assert server.sent["tools/list"] < 1 * MIB  # 50 MB of one letter: 50 KB compressed


async def test_a_small_compressed_listing_is_read_and_another_encoding_refused(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    async with huge_mcp(encoding="gzip") as server:
        await create(stub, user_of(server))
    async with huge_mcp(encoding="br") as server:
        error, _ = await refusal(stub, user_of(server))
    # Its initialize answer came in 'br' already: before a server has spoken MCP, a reply it
    # sends tells only that something listens, so it reads as a closed port does (the cause
    # goes to the log).
    assert the_violation(error).description == (
        "MCP server 'huge' could not be listed: it could not be reached or did not answer as an MCP server"
    )


async def test_the_pages_of_a_listing_count_together(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    async with huge_mcp(pages=[LISTING_LIMIT // 3 + 1] * 3) as server:
        error, _ = await refusal(stub, user_of(server))
        assert "its listing is larger than the limit" in the_violation(error).description
        assert server.methods.count("tools/list") == 3


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_a_listing_just_under_the_limit_is_accepted(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, sse: bool
) -> None:
    # Two pages, their envelopes and the initialize reply: 8 KiB under the limit on the wire.
    async with huge_mcp(pages=[LISTING_LIMIT // 2 - 4 * KIB] * 2, sse=sse) as server:
        runtime_id = await create(stub, user_of(server))
        model.script("user", call_then_answer("huge__big1_0", {"q": "x"}))
        handle_id, result = await run(stub, runtime_id, "user", "go")
    assert (result.status, result.text) == (pb.STATUS_DONE, "done")
    tools = {tool["function"]["name"]: tool["function"] for tool in model.requests[0]["tools"]}
    assert {"huge__big0_0", "huge__big1_0"} <= set(tools)
    # A description is cut to an AgentDef's bound (16 KiB), not refused.
    assert len(tools["huge__big0_0"]["description"]) == 16 * KIB
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert (tool_message.content, tool_message.is_error) == ("xx", False)


async def test_a_listed_schema_is_checked_as_an_agentdefs_naming_the_tool(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    async with huge_mcp(schema=deep) as server:
        error, _ = await refusal(stub, user_of(server))
    violation = the_violation(error)
    assert violation.field == "agents[0].mcp_servers[0]"
    assert violation.description == (
        "tool 'big0_0' of MCP server 'huge': its input schema nests deeper than 32 levels: leave it out with allowed_tools"
    )
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(1000)}}
    async with huge_mcp(schema=wide) as server:
        error, _ = await refusal(stub, user_of(server))
    size = len(json.dumps(wide, separators=(",", ":")))
    assert f"its input schema is {size} bytes as JSON; the limit is 65536" in the_violation(error).description


async def test_more_tools_than_an_agent_may_have_are_refused_at_the_server(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    async with huge_mcp(tools_per_page=129) as server:
        error, _ = await refusal(stub, user_of(server))
        violations = status_details(error)[0].field_violations
        assert violations[0].field == "agents[0].mcp_servers[0]"
        assert violations[0].description == (
            "MCP server 'huge' gives 129 tools, more than the agent's limit of 128 with its other tools: "
            "name the ones to use in allowed_tools"
        )
        await create(stub, user_of(server, allowed_tools=["big0_7"]))  # as allowed_tools would have it


async def test_what_a_runtime_keeps_of_its_listings_is_bounded_over_all_its_agents(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    """Each listing is under 4 MiB, but three agents listing it would keep 4.7 MiB: as much as
    one CreateRuntime request may hold is the bound (descriptions cut to 16 KiB count so)."""
    async with huge_mcp(pages=[100 * 16 * KIB], tools_per_page=100) as server:
        definitions = [agent(name, mcp_servers=user_of(server).mcp_servers) for name in ("a", "b", "c")]
        error, _ = await refusal(stub, *definitions)
        assert server.methods.count("tools/list") == 3
        await create(stub, *definitions[:2])
    violation = the_violation(error)
    assert violation.field == "agents[2].mcp_servers[0]"
    assert violation.description == (
        "with MCP server 'huge', the tools MCP servers give this runtime come to more than 4,194,304 bytes "
        "(descriptions, and input and output schemas as JSON): name the ones to use in allowed_tools"
    )


# ---- call results ----


@pytest.mark.parametrize(
    ("size", "sse"),
    [(HUGE, False), (HUGE, True), (TEXT_LIMIT + 1, False)],
    ids=["50MB-json", "50MB-sse", "one-byte-over"],
)
async def test_a_result_over_max_text_bytes_is_an_error_result_and_the_run_goes_on(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, size: int, sse: bool
) -> None:
    async with huge_mcp(result_bytes=size, sse=sse) as server:
        runtime_id = await create(stub, user_of(server))
        model.script("user", call_then_answer("huge__big0_0", {"q": "x"}))
        started = time.monotonic()
        handle_id, result = await run(stub, runtime_id, "user", "go")
        seconds = time.monotonic() - started
        if size == HUGE:
            await until(lambda: server.cut["tools/call"] == 1, "the call's connection to be dropped")
            assert server.sent["tools/call"] < 16 * MIB
    assert (result.status, result.text) == (pb.STATUS_DONE, "done")
    assert seconds < PROMPTLY, seconds
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error
    assert tool_message.content == (
        "MCP server 'huge': its result is larger than the limit of 262,144 bytes (AGENTRUNTIME_MAX_TEXT_BYTES)"
    )


async def test_a_result_of_max_text_bytes_is_whole(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    async with huge_mcp(result_bytes=TEXT_LIMIT, sse=True) as server:
        runtime_id = await create(stub, user_of(server))
        model.script("user", call_then_answer("huge__big0_0", {"q": "x"}))
        handle_id, _ = await run(stub, runtime_id, "user", "go")
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert (len(tool_message.content), tool_message.is_error) == (TEXT_LIMIT, False)
    session = ["initialize", "notifications/initialized"]
    assert server.methods == [*session, "tools/list", *session, "tools/call"]  # the call's session lists nothing


# ---- the server stays small and serves others meanwhile (a process of its own) ----


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    """VmHWM starts again from VmRSS (proc(5): clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


async def test_50_mb_from_an_mcp_server_keeps_the_server_small_and_another_tenants_inspect_fast(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    tokens = {"acme": "acme-write-token-6d1f0b", "globex": "globex-write-token-2c8e5a"}
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(
        json.dumps(
            [
                {"tenant": tenant, "token_sha256": hashlib.sha256(token.encode()).hexdigest(), "scopes": ["read", "write"]}
                for tenant, token in tokens.items()
            ]
        )
    )
    env = {
        "AGENTRUNTIME_AUTH": "tokens",
        "AGENTRUNTIME_AUTH_TOKENS_FILE": str(tokens_file),
        "AGENTRUNTIME_TOOL_EGRESS_ALLOW": '["127.0.0.0/8"]',  # the test's MCP servers
    }
    process = ServerProcess(tmp_path / "store.db", model.base_url, tmp_path / "server.log", env)
    stub = await process.start()
    acme, globex = bearer(tokens["acme"]), bearer(tokens["globex"])
    try:
        assert process.process is not None
        pid = process.process.pid
        async with huge_mcp(sse=True) as warm:  # the MCP SDK is imported at its first use
            await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[user_of(warm)]), metadata=acme)
        idle = agent("idle", script=pb.Script(replies=[pb.ScriptedReply(text="idle")]))
        other = await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[idle]), metadata=globex)
        spawned = await stub.Spawn(pb.SpawnRequest(runtime_id=other.runtime_id, parent_id="root", agent="idle"), metadata=globex)
        baseline = status_kib(pid, "VmRSS")
        reset_peak(pid)

        async with InspectProbe(process.address, other.runtime_id, spawned.handle_id, globex) as probe:
            async with huge_mcp(pages=[HUGE], sse=True) as listing:
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[user_of(listing)]), metadata=acme)
                listing_seconds = time.monotonic() - started
            assert "its listing is larger than the limit" in (refused.value.details() or "")

            # Accepted, near every bound: 3.9 MiB listed, 120 tools of ten properties.
            properties = {f"p{i}": {"type": "string", "description": "a parameter"} for i in range(10)}
            schema = {"type": "object", "properties": properties, "required": ["p0"]}
            async with huge_mcp(pages=[120 * 32 * KIB], tools_per_page=120, schema=schema) as near:
                started = time.monotonic()
                await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[user_of(near)]), metadata=acme)
                near_seconds = time.monotonic() - started

            async with huge_mcp(result_bytes=HUGE) as result:
                created = await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[user_of(result)]), metadata=acme)
                model.script("user", call_then_answer("huge__big0_0", {"q": "x"}))
                started = time.monotonic()
                handle = await stub.Spawn(
                    pb.SpawnRequest(runtime_id=created.runtime_id, parent_id="root", agent="user"), metadata=acme
                )
                await stub.Wake(
                    pb.WakeRequest(runtime_id=created.runtime_id, handle_id=handle.handle_id, prompt="go"), metadata=acme
                )
                waited = await stub.Wait(
                    pb.WaitRequest(runtime_id=created.runtime_id, handle_id=handle.handle_id), metadata=acme, timeout=30
                )
                call_seconds = time.monotonic() - started
            page = await stub.GetTranscript(
                pb.GetTranscriptRequest(runtime_id=created.runtime_id, handle_id=handle.handle_id), metadata=acme
            )
        peak = status_kib(pid, "VmHWM")
    finally:
        await process.stop()
    [tool_message] = [m for m in page.messages if m.role == "tool"]
    assert tool_message.is_error and "its result is larger than the limit" in tool_message.content
    assert (waited.result.status, waited.result.text) == (pb.STATUS_DONE, "done")
    growth = (peak - baseline) / 1024
    worst = max(probe.latencies) * 1000
    print(
        f"\nlisting refused in {listing_seconds:.2f} s, one near the limits taken in {near_seconds:.2f} s, "
        f"call done in {call_seconds:.2f} s; RSS {baseline / 1024:.0f} MiB, "
        f"peak +{growth:.1f} MiB; {len(probe.latencies)} Inspects, worst {worst:.1f} ms"
    )
    assert listing_seconds < PROMPTLY and call_seconds < PROMPTLY
    assert growth < 150, f"the server grew {growth:.0f} MiB"
    assert len(probe.latencies) >= 10
    assert worst < STALLED * 1000, f"an Inspect took {worst:.0f} ms"
