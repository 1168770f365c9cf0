"""Tenants on a test server (AUTH=tokens on a SQLite store file): the tokens of acme, globex and
default, a Caller that speaks as one of them, the agents scripted in CreateRuntime, and how a
quota's refusal reads."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.protobuf.message import Message as ProtoMessage
from google.rpc import error_details_pb2, status_pb2

from tests.support.build import duration
from tests.support.servers import Served, serve

# (tenant, token, scopes, name): the tokens file holds only their hashes.
ACME = ("acme", "tenant-acme-write-token-3f9a1c", ["read", "write"], "acme-ci")
GLOBEX = ("globex", "tenant-globex-write-token-7b2e4d", ["read", "write"], "globex-ci")
DEFAULT = ("default", "tenant-default-write-token-c0ffee", ["read", "write"], "ops")
ACME_READER = ("acme", "tenant-acme-read-token-51d0aa", ["read"], "acme-dashboard")
TOKENS = (ACME, GLOBEX, DEFAULT, ACME_READER)


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


class Caller:
    """One tenant's token on a stub: `await acme("Inspect", request)`."""

    def __init__(self, stub: pb_grpc.AgentRuntimeAsyncStub, entry: tuple[str, str, list[str], str]) -> None:
        self.stub = stub
        self.tenant, self.token, _, self.name = entry

    def __call__(self, method: str, request: ProtoMessage, timeout: float = 30) -> Awaitable[Any]:
        call: Awaitable[Any] = getattr(self.stub, method)(request, metadata=bearer(self.token), timeout=timeout)
        return call

    async def watch_first(self, request: pb.WatchRequest, timeout: float = 5) -> pb.WatchResponse | None:
        call = self.stub.Watch(request, metadata=bearer(self.token), timeout=timeout)
        try:
            async for response in call:
                return response
            return None
        finally:
            call.cancel()

    async def run(self, runtime_id: str, agent_name: str, prompt: str) -> tuple[str, pb.TaskResult]:
        spawned = await self("Spawn", pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent=agent_name))
        await self("Wake", pb.WakeRequest(runtime_id=runtime_id, handle_id=spawned.handle_id, prompt=prompt))
        waited = await self("Wait", pb.WaitRequest(runtime_id=runtime_id, handle_id=spawned.handle_id))
        return spawned.handle_id, waited.result

    async def runtimes(self, page_size: int = 1000) -> dict[str, pb.RuntimeSummary]:
        listed = await self("ListRuntimes", pb.ListRuntimesRequest(page_size=page_size))
        assert not listed.next_page_token
        return {summary.runtime_id: summary for summary in listed.runtimes}


def write_tokens(path: Path) -> None:
    path.write_text(
        json.dumps(
            [
                {"tenant": tenant, "token_sha256": hashlib.sha256(token.encode()).hexdigest(), "scopes": scopes, "name": name}
                for tenant, token, scopes, name in TOKENS
            ]
        )
    )


@asynccontextmanager
async def tenant_server(tmp_path: Path, **overrides: Any) -> AsyncIterator[Served]:
    """AUTH=tokens with the four tokens above, on a SQLite store file (tmp_path/store.db)."""
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens)
    settings: dict[str, Any] = {"auth": "tokens", "auth_tokens_file": str(tokens), "store": f"sqlite:///{tmp_path / 'store.db'}"}
    async with serve(**{**settings, **overrides}) as served:
        yield served


async def refused(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def details(error: grpc.aio.AioRpcError) -> list[Any]:
    """Every google.rpc detail of the error (QuotaFailure included), unpacked."""
    kinds = (
        error_details_pb2.BadRequest,
        error_details_pb2.ErrorInfo,
        error_details_pb2.ResourceInfo,
        error_details_pb2.QuotaFailure,
    )
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            found: list[Any] = []
            for packed in status_pb2.Status.FromString(value).details:
                for kind in kinds:
                    if packed.Is(kind.DESCRIPTOR):
                        unpacked = kind()
                        packed.Unpack(unpacked)
                        found.append(unpacked)
            return found
    return []


def detail(error: grpc.aio.AioRpcError, kind: type[Any]) -> Any:
    found = [item for item in details(error) if isinstance(item, kind)]
    assert len(found) == 1, (kind.__name__, details(error))
    return found[0]


def reply(text: str = "", tokens: int = 5, calls: tuple[tuple[str, str], ...] = (), delay: float = 0.0) -> pb.ScriptedReply:
    scripted = pb.ScriptedReply(
        text=text, tokens=tokens, tool_calls=[pb.ScriptedToolCall(name=name, arguments_json=args) for name, args in calls]
    )
    if delay:
        scripted.delay.CopyFrom(duration(delay))
    return scripted


def scripted(name: str, *replies: pb.ScriptedReply, tools: tuple[pb.ToolDef, ...] = ()) -> pb.AgentDef:
    return pb.AgentDef(name=name, description=f"the {name} agent", tools=list(tools), script=pb.Script(replies=list(replies)))


LOOKUP = pb.ToolDef(name="lookup", description="the host looks it up", relay=pb.RelayTool())


ASKER = scripted("asker", reply(calls=(("lookup", '{"q": "x"}'),)), reply("answered"), tools=(LOOKUP,))


def assert_quota(error: grpc.aio.AioRpcError, tenant: str, quota: str) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    failure = detail(error, error_details_pb2.QuotaFailure)
    assert [violation.subject for violation in failure.violations] == [f"tenant:{tenant}"]
    info = detail(error, error_details_pb2.ErrorInfo)
    assert info.metadata["quota"] == quota, info
    assert info.reason == "QUOTA_EXCEEDED"
