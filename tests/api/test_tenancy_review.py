"""An outside review of tenancy and authentication: a credential revoked while its stream is
open (Watch, ServeTools) gets nothing more on it, and the runs a tenant's own timers start
(a heartbeat, a Request's lapse) keep to its running-handles quota. Real servers on
loopback; AUTH=tokens, the tokens file rewritten to revoke."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, duration, http_tool, spawn, wait
from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.servers import serve
from tests.support.sign_in import SignInTool, crm_script, signin
from tests.support.tenants import ACME, Caller, assert_quota, refused, reply, scripted, tenant_server

# (tenant, token, scopes, name), as in test_tenants: the file holds only their hashes.
DRIVER = ("acme", "review-acme-driver-token-8c1f", ["read", "write"], "acme-driver")
WATCHER = ("acme", "review-acme-watcher-token-2d7e", ["read"], "acme-dashboard")
WORKER = ("acme", "review-acme-worker-token-9a4b", ["read", "write"], "acme-worker")
# The tokens file is looked at once a second, and an open stream verifies its caller again
# at most once a second: past both, a revoked token is refused everywhere.
REVOKED_EVERYWHERE = 2.2

__all__ = ["signin"]  # the fixture of tests/support/sign_in.py, used here


def write_tokens(path: Path, *entries: tuple[str, str, list[str], str]) -> None:
    path.write_text(
        json.dumps(
            [
                {"tenant": tenant, "token_sha256": hashlib.sha256(token.encode()).hexdigest(), "scopes": scopes, "name": name}
                for tenant, token, scopes, name in entries
            ]
        )
    )


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


async def revoke(path: Path, stub: pb_grpc.AgentRuntimeStub, token: str, *kept: tuple[str, str, list[str], str]) -> None:
    """Rewrites the file without `token`, and waits until a new call with it is refused."""
    write_tokens(path, *kept)
    await asyncio.sleep(REVOKED_EVERYWHERE)
    error = await refused(stub.List(pb.ListRequest(runtime_id="any"), metadata=bearer(token), timeout=10))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in (error.details() or ""), error


async def test_a_watch_opened_with_a_token_stops_when_the_token_is_revoked(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, DRIVER, WATCHER)
    async with serve(auth="tokens", auth_tokens_file=str(tokens)) as served:
        driver = Caller(served.stub, DRIVER)
        await driver("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="watched", agents=[scripted("solo", reply("hi"))]))
        watch = served.stub.Watch(pb.WatchRequest(runtime_id="watched"), metadata=bearer(WATCHER[1]), timeout=30)
        seen: list[str] = []
        ended: list[grpc.StatusCode] = []

        async def follow() -> None:
            try:
                async for response in watch:
                    seen.append(response.event.handle_id)
            except grpc.aio.AioRpcError as error:
                ended.append(error.code())

        following = asyncio.ensure_future(follow())
        try:
            before_id, result = await driver.run("watched", "solo", "before")
            assert result.status == pb.STATUS_DONE
            await asyncio.sleep(0.3)
            assert before_id in seen, seen  # the stream works while the token is good

            await revoke(tokens, served.stub, WATCHER[1], DRIVER)
            after_id, result = await driver.run("watched", "solo", "after")
            assert result.status == pb.STATUS_DONE
            await asyncio.wait({following}, timeout=5)
            # The revoked watcher sees nothing of the runtime after its revocation.
            assert after_id not in seen, seen
            assert ended == [grpc.StatusCode.UNAUTHENTICATED], ended
        finally:
            watch.cancel()
            await asyncio.gather(following, return_exceptions=True)


async def test_a_worker_whose_token_is_revoked_is_sent_no_more_calls(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, DRIVER, WORKER)
    ping = pb.ToolDef(name="ping", description="pings", worker=pb.WorkerTool(queue="work", timeout=duration(2)))
    pinger = scripted("pinger", reply(calls=(("ping", '{"secret": "for a live worker only"}'),)), reply("pinged"), tools=(ping,))
    async with serve(auth="tokens", auth_tokens_file=str(tokens)) as served:
        driver = Caller(served.stub, DRIVER)
        await driver("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="tools", agents=[pinger]))
        outputs: asyncio.Queue[pb.ServeToolsRequest] = asyncio.Queue()
        await outputs.put(pb.ServeToolsRequest(registration=pb.WorkerRegistration(queue="work", tools=["ping"])))

        async def requests() -> AsyncIterator[pb.ServeToolsRequest]:
            while True:
                yield await outputs.get()

        stream = served.stub.ServeTools(requests(), metadata=bearer(WORKER[1]), timeout=60)
        received: list[pb.WorkerCall] = []
        ended: list[grpc.StatusCode] = []

        async def work() -> None:
            try:
                async for response in stream:
                    if response.WhichOneof("message") == "call":
                        received.append(response.call)
                        await outputs.put(pb.ServeToolsRequest(output=pb.ToolOutput(call_id=response.call.id, output="pong")))
            except grpc.aio.AioRpcError as error:
                ended.append(error.code())

        working = asyncio.ensure_future(work())
        try:
            _, result = await driver.run("tools", "pinger", "before")
            assert result.status == pb.STATUS_DONE and len(received) == 1, (result, received)

            await revoke(tokens, served.stub, WORKER[1], DRIVER)
            _, result = await driver.run("tools", "pinger", "after")
            assert result.status != pb.STATUS_UNSPECIFIED
            await asyncio.wait({working}, timeout=5)
            # The revoked worker was not given the second call, its arguments included.
            assert len(received) == 1, received
            assert ended == [grpc.StatusCode.UNAUTHENTICATED], ended
        finally:
            stream.cancel()
            await asyncio.gather(working, return_exceptions=True)


async def test_a_heartbeat_starts_no_run_past_the_tenants_running_handles_quota(tmp_path: Path) -> None:
    beating = scripted("beating", reply("slow", delay=20), reply("slow", delay=20))
    beating.heartbeat.CopyFrom(pb.Heartbeat(every=duration(1), prompt="tick"))
    async with tenant_server(tmp_path, quota_running_handles=1) as served:
        acme = Caller(served.stub, ACME)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="beats", agents=[beating]))
        spawned = [await acme("Spawn", pb.SpawnRequest(runtime_id="beats", parent_id="root", agent="beating")) for _ in range(3)]
        await asyncio.sleep(2.5)  # two beats of every handle
        listed = await acme("List", pb.ListRequest(runtime_id="beats"))
        states = [view.state for view in listed.handles]
        assert states.count(pb.HANDLE_STATE_RUNNING) == 1, states
        # A handle the quota held back keeps its tick and is woken as a Wake would be: refused.
        held = next(view.handle_id for view in listed.handles if view.state != pb.HANDLE_STATE_RUNNING)
        assert held in {handle.handle_id for handle in spawned}
        error = await refused(acme("Wake", pb.WakeRequest(runtime_id="beats", handle_id=held, prompt="now")))
        assert_quota(error, "acme", "running_handles")


async def test_an_expired_request_lapses_once_the_tenants_running_handles_quota_has_room(
    model: ScriptedModelServer, signin: SignInTool
) -> None:
    signin.expires_in = 1.0
    model.script("crm", crm_script)
    slow = scripted("slow", reply("slow done", delay=4))
    async with serve(llm_style="openai", llm_base_url=model.base_url, quota_running_handles=1) as served:
        stub = served.stub
        crm = agent("crm", tools=[http_tool("crm_login", signin.url())])
        await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="lapse", agents=[crm, slow]))
        asking = await spawn(stub, "lapse", "crm")
        await stub.Wake(pb.WakeRequest(runtime_id="lapse", handle_id=asking, prompt="log in"))
        assert (await wait(stub, "lapse", asking)).status == pb.STATUS_PENDING
        # The tenant's one running handle holds the quota when the Request expires.
        busy = await spawn(stub, "lapse", "slow")
        await stub.Wake(pb.WakeRequest(runtime_id="lapse", handle_id=busy, prompt="take your time"))
        assert (await wait(stub, "lapse", busy)).status == pb.STATUS_DONE
        await until(lambda: model.calls["crm"] >= 2, timeout=5, what="the expired Request lapsed once the quota had room")
        assert (await wait(stub, "lapse", asking)).status == pb.STATUS_DONE
