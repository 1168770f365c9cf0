"""The edge: TLS and mTLS, bearer tokens (revocable without a restart), JWTs from a JWKS file or
URL, scopes, and the guard against an open plaintext server. A token revoked while its stream
is open (Watch, ServeTools) gets nothing more on it. Each JWT refusal names its own
reason, never quoting the token; a JWKS URL whose answer is not a JWKS, resets mid-answer or
never ends is the server's problem (UNAVAILABLE), not the token's and not INTERNAL. Real
servers on loopback; certificates made by trustme, keys by cryptography, in the test."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import trustme
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.api import jwt_auth, watched_file
from agentruntime_server.api.auth import build_authenticator
from agentruntime_server.api.tls import is_loopback, transport
from agentruntime_server.app import start
from agentruntime_server.domain.errors import PermissionDenied, Unauthenticated
from agentruntime_server.settings import StartupError
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.support.auth import (
    AUDIENCE,
    ISSUER,
    READ_TOKEN,
    READER,
    WRITE_TOKEN,
    WRITER,
    JwksServer,
    Pki,
    bearer,
    claims,
    digest,
    pki,
    public_jwk,
    refused,
    sign,
    tokens_file,
    unauthenticated,
    write_tokens,
)
from tests.support.build import agent, create, duration
from tests.support.loopback import Loopback
from tests.support.poll import until
from tests.support.servers import Served, serve, server_settings
from tests.support.tenants import Caller, reply, scripted

__all__ = ["pki", "tokens_file"]  # fixtures of tests/support, used here


# ---- helpers ----


def write_text(path: Path, text: str) -> None:
    path.write_text(text)


async def denied(call: Awaitable[Any]) -> None:
    error = await refused(call)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
    assert "'write' scope" in (error.details() or ""), error.details()


async def health_check(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return int(reply.status)


async def settle_one(stub: pb_grpc.AgentRuntimeAsyncStub, token: str, runtime_id: str) -> str:
    """CreateRuntime, Spawn, Wake and Wait as `token`; the settled handle's id."""
    metadata = bearer(token)
    await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[agent("solo")]), metadata=metadata)
    spawned = await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="solo"), metadata=metadata)
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=spawned.handle_id, prompt="hi"), metadata=metadata)
    waited = await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=spawned.handle_id), metadata=metadata)
    assert waited.result.status == pb.STATUS_DONE
    return spawned.handle_id


def mutating_requests(runtime_id: str, handle_id: str) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = [
        ("Wake", pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="again")),
        ("Resume", pb.ResumeRequest(runtime_id=runtime_id, answer=pb.Answer(id="req-1", ok=True))),
        ("Close", pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id)),
        ("Spawn", pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="solo")),
        ("Post", pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="hello")),
        ("Interrupt", pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id)),
        ("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="another", agents=[agent("solo")])),
    ]
    if hasattr(pb, "DeleteRuntimeRequest"):
        calls.append(("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id=runtime_id)))
    return calls


# ---- AUTH=tokens ----


@pytest.fixture
async def token_server(tokens_file: Path) -> AsyncIterator[Served]:
    async with serve(auth="tokens", auth_tokens_file=str(tokens_file)) as served:
        yield served


async def test_missing_wrong_and_malformed_tokens_are_unauthenticated(token_server: Served) -> None:
    stub = token_server.stub
    request = pb.ListRequest(runtime_id="any")
    await unauthenticated(stub.List(request), "missing credentials")
    await unauthenticated(stub.List(request, metadata=bearer("not-a-token-of-ours")), "not valid", "not-a-token-of-ours")
    await unauthenticated(stub.List(request, metadata=(("authorization", f"Basic {READ_TOKEN}"),)), "not a bearer", READ_TOKEN)
    await unauthenticated(stub.List(request, metadata=(("authorization", "Bearer "),)), "")
    # Streams too: Watch checks before it streams anything.
    await unauthenticated(_first(stub.Watch(pb.WatchRequest(runtime_id="any"))), "missing credentials")


async def test_failed_authentications_are_logged_and_counted_never_with_the_token(
    tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Reads and streams too (the audit log has only mutating calls): one warning a failure on the
    auth logger (RPC, peer, reason) and agentruntime_auth_failures_total{grpc_method, reason}."""
    wrong = "wrong-token-0123456789-never-logged"
    caplog.set_level(logging.INFO)
    async with serve(auth="tokens", auth_tokens_file=str(tokens_file), metrics_listen="127.0.0.1:0") as served:
        stub = served.stub
        await unauthenticated(stub.List(pb.ListRequest(runtime_id="any")), "missing credentials")
        inspect = pb.InspectRequest(runtime_id="any", handle_id="h")
        await unauthenticated(stub.Inspect(inspect, metadata=bearer(wrong)), "not valid")
        await unauthenticated(_first(stub.Watch(pb.WatchRequest(runtime_id="any"), metadata=bearer(wrong))), "not valid")
        await unauthenticated(stub.List(pb.ListRequest(runtime_id="any"), metadata=(("authorization", f"Basic {wrong}"),)), "")
        await stub.ListRuntimes(pb.ListRuntimesRequest(), metadata=bearer(READ_TOKEN))  # a good one is neither
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{served.running.metrics_port}/metrics") as response,
        ):
            scraped = await response.text()
    counted = {
        (sample.labels["grpc_method"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name == "agentruntime_auth_failures_total"
    }
    assert counted == {("List", "missing"): 1, ("Inspect", "invalid"): 1, ("Watch", "invalid"): 1, ("List", "malformed"): 1}
    lines = [r.getMessage() for r in caplog.records if r.name == "agentruntime_server.api.auth" and r.levelno == logging.WARNING]
    assert len(lines) == 4, lines
    assert all(line.startswith("authentication failed: rpc=") and "peer=ipv4:127.0.0.1:" in line for line in lines)
    assert "rpc=Watch" in lines[2] and "reason=invalid" in lines[2]
    assert not any(wrong in record.getMessage() or READ_TOKEN in record.getMessage() for record in caplog.records)


async def _first(call: Any) -> Any:
    async for response in call:
        return response
    return None


async def test_health_answers_without_credentials(token_server: Served) -> None:
    assert await health_check(token_server.channel) == health_pb2.HealthCheckResponse.SERVING


async def test_a_write_token_can_do_everything(token_server: Served) -> None:
    stub = token_server.stub
    metadata = bearer(WRITE_TOKEN)
    handle_id = await settle_one(stub, WRITE_TOKEN, "rw")
    assert (await stub.Inspect(pb.InspectRequest(runtime_id="rw", handle_id=handle_id), metadata=metadata)).handle.handle_id
    assert len((await stub.List(pb.ListRequest(runtime_id="rw"), metadata=metadata)).handles) == 1
    await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id="rw", handle_id=handle_id), metadata=metadata)
    await stub.Post(pb.PostRequest(runtime_id="rw", handle_id=handle_id, text="more"), metadata=metadata)
    # Past authentication, the runtime's own answer: no live request has that id.
    error = await refused(stub.Resume(pb.ResumeRequest(runtime_id="rw", answer=pb.Answer(id="nope", ok=True)), metadata=metadata))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    await stub.Close(pb.CloseRequest(runtime_id="rw", handle_id=handle_id, force=True), metadata=metadata)
    if hasattr(pb, "DeleteRuntimeRequest"):
        await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id="rw", force=True), metadata=metadata)


async def test_a_read_token_reads_and_is_denied_every_change(token_server: Served) -> None:
    stub = token_server.stub
    handle_id = await settle_one(stub, WRITE_TOKEN, "ro")
    metadata = bearer(READ_TOKEN)
    listed = await stub.List(pb.ListRequest(runtime_id="ro"), metadata=metadata)
    assert [view.handle_id for view in listed.handles] == [handle_id]
    inspected = await stub.Inspect(pb.InspectRequest(runtime_id="ro", handle_id=handle_id), metadata=metadata)
    assert inspected.handle.handle_id == handle_id
    waited = await stub.Wait(pb.WaitRequest(runtime_id="ro", handle_id=handle_id), metadata=metadata)
    assert waited.result.status == pb.STATUS_DONE
    await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id="ro", handle_id=handle_id), metadata=metadata)
    for name, request in mutating_requests("ro", handle_id):
        await denied(getattr(stub, name)(request, metadata=metadata))
    # Nothing changed: the handle is as it was.
    again = await stub.Inspect(pb.InspectRequest(runtime_id="ro", handle_id=handle_id), metadata=metadata)
    assert again.handle.state == inspected.handle.state


async def test_a_token_removed_from_the_file_is_revoked_without_a_restart(token_server: Served, tokens_file: Path) -> None:
    stub = token_server.stub
    await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="before", agents=[agent("solo")]), metadata=bearer(WRITE_TOKEN))
    write_tokens(tokens_file, READER)  # the writer's token is gone
    await asyncio.sleep(1.2)  # the file is looked at once a second at most
    request = pb.CreateRuntimeRequest(runtime_id="after", agents=[agent("solo")])
    await unauthenticated(stub.CreateRuntime(request, metadata=bearer(WRITE_TOKEN)), "revoked", WRITE_TOKEN)
    await stub.List(pb.ListRequest(runtime_id="before"), metadata=bearer(READ_TOKEN))  # the others still work


async def test_a_bad_tokens_file_keeps_the_last_good_one_and_warns_once(
    tokens_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(watched_file, "RECHECK_SECONDS", 0.0)
    authenticator = build_authenticator(server_settings(auth="tokens", auth_tokens_file=str(tokens_file)))
    principal = await authenticator.authenticate(bearer(READ_TOKEN), "List")
    assert (principal.tenant, principal.name, principal.scopes) == ("acme", "dashboard", frozenset({"read"}))
    with pytest.raises(PermissionDenied, match="Wake needs the 'write' scope"):
        await authenticator.authenticate(bearer(READ_TOKEN), "Wake")
    write_text(tokens_file, '[{"tenant": "acme", "token_sha256": ')  # half written
    with caplog.at_level(logging.WARNING, logger="agentruntime_server.api.auth"):
        for _ in range(3):
            assert (await authenticator.authenticate(bearer(READ_TOKEN), "List")).tenant == "acme"
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "is not JSON" in warnings[0] and str(tokens_file) in warnings[0], warnings
    write_tokens(tokens_file, WRITER, ("bad/tenant", "odd-token", ["read"], "odd"))
    with pytest.raises(Unauthenticated, match="revoked"):
        await authenticator.authenticate(bearer(READ_TOKEN), "List")
    with pytest.raises(Unauthenticated, match="tenant is not a tenant name"):
        await authenticator.authenticate(bearer("odd-token"), "List")
    assert (await authenticator.authenticate(bearer(WRITE_TOKEN), "Wake")).name == "ci-bot"


# (tenant, token, scopes, name), as in tests/support/tenants.py: the file holds only their hashes.
DRIVER = ("acme", "review-acme-driver-token-8c1f", ["read", "write"], "acme-driver")
WATCHER = ("acme", "review-acme-watcher-token-2d7e", ["read"], "acme-dashboard")
WORKER = ("acme", "review-acme-worker-token-9a4b", ["read", "write"], "acme-worker")
# The tokens file is looked at once a second, and an open stream verifies its caller again
# at most once a second: past both, a revoked token is refused everywhere.
REVOKED_EVERYWHERE = 2.2


async def revoke(path: Path, stub: pb_grpc.AgentRuntimeAsyncStub, token: str, *kept: tuple[str, str, list[str], str]) -> None:
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
            await until(lambda: before_id in seen, "the watcher to see the run before the revocation", timeout=10)
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


# ---- AUTH=jwt ----


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def forge(header: dict[str, Any], body: dict[str, Any], secret: bytes | None) -> str:
    """A JWT PyJWT refuses to make: `none`, or HS256 keyed with the public key."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{part(json.dumps(header).encode())}.{part(json.dumps(body).encode())}"
    signature = b"" if secret is None else hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{part(signature)}"


@pytest.fixture
def signer() -> rsa.RSAPrivateKey:
    return rsa_key()


@pytest.fixture
async def jwt_server(tmp_path: Path, signer: rsa.RSAPrivateKey) -> AsyncIterator[Served]:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public_jwk(signer, "k1", "RS256")]}))
    async with serve(auth="jwt", auth_jwks=str(jwks), auth_issuer=ISSUER, auth_audience=AUDIENCE) as served:
        yield served


async def test_jwts_from_a_jwks_file(jwt_server: Served, signer: rsa.RSAPrivateKey) -> None:
    stub = jwt_server.stub
    handle_id = await settle_one(stub, sign(signer), "jwt")
    reader = sign(signer, scope=None, scp=["read"])
    listed = await stub.List(pb.ListRequest(runtime_id="jwt"), metadata=bearer(reader))
    assert [view.handle_id for view in listed.handles] == [handle_id]
    await denied(stub.Wake(pb.WakeRequest(runtime_id="jwt", handle_id=handle_id, prompt="x"), metadata=bearer(reader)))
    assert await health_check(jwt_server.channel) == health_pb2.HealthCheckResponse.SERVING

    request = pb.ListRequest(runtime_id="jwt")
    now = int(time.time())
    public_pem = signer.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    cases = {
        "has expired": sign(signer, iat=now - 600, exp=now - 300),
        "signature does not verify": sign(rsa_key()),
        "another audience": sign(signer, aud="someone-else"),
        "another issuer": sign(signer, iss="https://elsewhere.test"),
        "no 'tenant' claim": sign(signer, tenant=None),
        "not a tenant name": sign(signer, tenant="../etc"),
        "no 'exp' claim": sign(signer, exp=None),
        "not in the JWKS": sign(signer, kid="k2"),
        "algorithm ('alg') is not one": forge({"alg": "none", "kid": "k1", "typ": "JWT"}, claims(), None),
        "algorithm ('alg') is not one this": forge({"alg": "HS256", "kid": "k1", "typ": "JWT"}, claims(), public_pem),
        "not a valid JWT": "abc.def",
    }
    for says, token in cases.items():
        await unauthenticated(stub.List(request, metadata=bearer(token)), says, token)
    await unauthenticated(stub.List(request), "missing credentials")


async def test_jwt_settings_choose_the_tenant_claim(tmp_path: Path, signer: rsa.RSAPrivateKey) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public_jwk(signer, "k1", "RS256")]}))
    settings = server_settings(
        auth="jwt", auth_jwks=str(jwks), auth_issuer=ISSUER, auth_audience=AUDIENCE, auth_tenant_claim="org"
    )
    authenticator = build_authenticator(settings)
    principal = await authenticator.authenticate(bearer(sign(signer, tenant=None, org="globex")), "Wake")
    assert (principal.tenant, principal.name, principal.scopes) == ("globex", "svc-a", frozenset({"read", "write"}))
    with pytest.raises(Unauthenticated, match="no 'org' claim"):
        await authenticator.authenticate(bearer(sign(signer)), "List")
    with pytest.raises(PermissionDenied, match="has no scope"):
        await authenticator.authenticate(bearer(sign(signer, org="globex", scope=None)), "List")


async def test_jwts_from_a_jwks_url_fetched_once_and_cached() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    jwks = JwksServer([public_jwk(key, "es-1", "ES256")])
    await jwks.start()
    try:
        async with serve(auth="jwt", auth_jwks=jwks.url, auth_issuer=ISSUER, auth_audience=AUDIENCE) as served:
            assert jwks.fetches == 0  # nothing fetched at start: an identity provider down does not stop the server
            token = sign(key, kid="es-1", alg="ES256")
            handle_id = await settle_one(served.stub, token, "url")
            await served.stub.Inspect(pb.InspectRequest(runtime_id="url", handle_id=handle_id), metadata=bearer(token))
            assert jwks.fetches == 1
            request = pb.ListRequest(runtime_id="url")
            await unauthenticated(
                served.stub.List(request, metadata=bearer(sign(key, kid="es-2", alg="ES256"))), "not in the JWKS"
            )
            await unauthenticated(
                served.stub.List(request, metadata=bearer(sign(key, kid="es-3", alg="ES256"))), "not in the JWKS"
            )
            assert jwks.fetches == 1  # an unknown kid refetches at most every 30 s
            other = ec.generate_private_key(ec.SECP256R1())
            await unauthenticated(
                served.stub.List(request, metadata=bearer(sign(other, kid="es-1", alg="ES256"))), "signature does not verify"
            )
    finally:
        await jwks.stop()


async def test_a_jwks_url_that_goes_down_keeps_the_keys_fetched_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jwt_auth, "JWKS_LIFESPAN_SECONDS", 0.3)
    key = ec.generate_private_key(ec.SECP256R1())
    jwks = JwksServer([public_jwk(key, "es-1", "ES256")])
    await jwks.start()
    stopped = False
    try:
        async with serve(auth="jwt", auth_jwks=jwks.url, auth_issuer=ISSUER, auth_audience=AUDIENCE) as served:
            token = sign(key, kid="es-1", alg="ES256")
            await served.stub.CreateRuntime(
                pb.CreateRuntimeRequest(runtime_id="down", agents=[agent("solo")]), metadata=bearer(token)
            )
            await jwks.stop()
            stopped = True
            await asyncio.sleep(0.4)  # the cached JWKS is stale: the next call fetches, and cannot
            await served.stub.List(pb.ListRequest(runtime_id="down"), metadata=bearer(token))
            assert jwks.fetches == 1
    finally:
        if not stopped:
            await jwks.stop()


async def test_an_unreachable_jwks_url_is_unavailable_not_a_bad_token(signer: rsa.RSAPrivateKey) -> None:
    closed = JwksServer([])
    await closed.start()
    url = closed.url
    await closed.stop()
    async with serve(auth="jwt", auth_jwks=url, auth_issuer=ISSUER, auth_audience=AUDIENCE) as served:
        error = await refused(served.stub.List(pb.ListRequest(runtime_id="x"), metadata=bearer(sign(signer))))
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "retry" in (error.details() or "")


async def test_each_jwt_refusal_names_its_own_reason(jwt_server: Served, signer: rsa.RSAPrivateKey) -> None:
    request = pb.ListRequest(runtime_id="jwt")
    now = int(time.time())
    reasons = {
        "has expired": sign(signer, iat=now - 600, exp=now - 300),
        "not valid yet ('nbf')": sign(signer, nbf=now + 600, exp=now + 900),
        "issued in the future ('iat')": sign(signer, iat=now + 600, exp=now + 900),
        "for another audience ('aud')": sign(signer, aud="someone-else"),
        "from another issuer ('iss')": sign(signer, iss="https://elsewhere.test"),
        "signature does not verify": sign(rsa_key()),
        "key ('kid') is not in the JWKS": sign(signer, kid="k2"),
        "'iat' is not a time": sign(signer, iat="yesterday"),
        "'exp' is not a time": sign(signer, exp="tomorrow"),
        "'nbf' is not a time": sign(signer, nbf="soon"),
        "'sub' claim is not a string": sign(signer, sub=42),
        "'jti' claim is not a string": sign(signer, jti=5),
    }
    for says, token in reasons.items():
        await unauthenticated(jwt_server.stub.List(request, metadata=bearer(token)), says, token)
    error = await refused(jwt_server.stub.List(request, metadata=bearer(reasons["issued in the future ('iat')"])))
    assert "nbf" not in (error.details() or ""), error.details()


class BrokenJwks(Loopback):
    """A JWKS URL that answers 200 with something that is not a JWKS."""

    def __init__(self, body: str) -> None:
        self.body = body

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/jwks.json", self.jwks)

    async def jwks(self, request: web.Request) -> web.Response:
        return web.Response(text=self.body, content_type="application/json")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks.json"


@pytest.mark.parametrize("body", ["<html>sign in</html>", "[]", '"keys"'])
async def test_a_jwks_url_answering_something_else_is_unavailable_not_a_bad_token(body: str, signer: rsa.RSAPrivateKey) -> None:
    jwks = BrokenJwks(body)
    await jwks.start()
    try:
        async with serve(auth="jwt", auth_jwks=jwks.url, auth_issuer=ISSUER, auth_audience=AUDIENCE) as served:
            error = await refused(served.stub.List(pb.ListRequest(runtime_id="x"), metadata=bearer(sign(signer))))
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "retry" in (error.details() or ""), error.details()
            # Nothing of that answer is kept: once the URL serves the JWKS, the token is good.
            jwks.body = json.dumps({"keys": [public_jwk(signer, "k1", "RS256")]})
            await served.stub.ListRuntimes(pb.ListRuntimesRequest(), metadata=bearer(sign(signer)))
    finally:
        await jwks.stop()


async def test_a_jwks_url_whose_connection_resets_mid_answer_is_unavailable(signer: rsa.RSAPrivateKey) -> None:
    async def reset_mid_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"keys": [')
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # linger 0: a reset, not an orderly close

    jwks = await asyncio.start_server(reset_mid_answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{jwks.sockets[0].getsockname()[1]}/jwks.json"
    try:
        async with serve(auth="jwt", auth_jwks=url, auth_issuer=ISSUER, auth_audience=AUDIENCE) as served:
            error = await refused(served.stub.List(pb.ListRequest(runtime_id="x"), metadata=bearer(sign(signer))))
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "cannot fetch its JWKS" in (error.details() or ""), error.details()
    finally:
        jwks.close()
        await jwks.wait_closed()


async def test_a_jwks_url_answering_without_end_is_read_to_a_bound_and_a_deadline(
    signer: rsa.RSAPrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endless answer is read to 1 MiB; one that drips is given the timeout in all, not per read."""
    monkeypatch.setattr(jwt_auth, "JWKS_TIMEOUT_SECONDS", 1.0)
    sent = {"endless": 0, "drip": 0}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        kind = "drip" if b"/drip" in head else "endless"
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"keys": [')
        try:
            while sent[kind] < 64 * 1024 * 1024:
                writer.write(b" " * (1 if kind == "drip" else 64 * 1024))
                await writer.drain()
                sent[kind] += 1 if kind == "drip" else 64 * 1024
                if kind == "drip":
                    await asyncio.sleep(0.05)
        except ConnectionError:
            pass
        finally:
            writer.close()

    jwks = await asyncio.start_server(answer, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{jwks.sockets[0].getsockname()[1]}"
    try:
        for path in ("/endless", "/drip"):
            async with serve(auth="jwt", auth_jwks=base + path, auth_issuer=ISSUER, auth_audience=AUDIENCE) as served:
                started = time.monotonic()
                call = served.stub.List(pb.ListRequest(runtime_id="x"), metadata=bearer(sign(signer)), timeout=10)
                error = await refused(call)
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                assert "cannot fetch its JWKS" in (error.details() or ""), error.details()
                assert time.monotonic() - started < 3.0
    finally:
        jwks.close()
        await jwks.wait_closed()
    assert sent["endless"] < 16 * 1024 * 1024  # 1 MiB read, and what the sockets' buffers took


# ---- TLS and mTLS ----


async def list_over(port: int, credentials: grpc.ChannelCredentials) -> grpc.StatusCode:
    options = [("grpc.ssl_target_name_override", "localhost")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        stub = pb_grpc.AgentRuntimeStub(channel)
        try:
            await create(stub, agent("solo"), runtime_id="tls")
            await stub.List(pb.ListRequest(runtime_id="tls"), timeout=10)
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK


async def test_tls_serves_clients_that_trust_its_ca(pki: Pki) -> None:
    async with serve(tls_cert=str(pki.cert), tls_key=str(pki.key)) as served:
        assert await list_over(served.port, pki.client_credentials()) == grpc.StatusCode.OK
        assert await list_over(served.port, pki.client_credentials(trusted=False)) == grpc.StatusCode.UNAVAILABLE
        # Plaintext against a TLS port fails too.
        assert (
            await refused(served.stub.List(pb.ListRequest(runtime_id="tls"), timeout=10))
        ).code() == grpc.StatusCode.UNAVAILABLE


async def test_mtls_requires_a_client_certificate_its_ca_signed(pki: Pki) -> None:
    async with serve(tls_cert=str(pki.cert), tls_key=str(pki.key), tls_client_ca=str(pki.client_ca_file)) as served:
        assert await list_over(served.port, pki.client_credentials()) == grpc.StatusCode.UNAVAILABLE
        assert await list_over(served.port, pki.client_credentials(client_of=trustme.CA())) == grpc.StatusCode.UNAVAILABLE
        assert await list_over(served.port, pki.client_credentials(client_of=pki.client_ca)) == grpc.StatusCode.OK


async def test_tls_and_bearer_tokens_together(pki: Pki, tokens_file: Path) -> None:
    async with serve(tls_cert=str(pki.cert), tls_key=str(pki.key), auth="tokens", auth_tokens_file=str(tokens_file)) as served:
        options = [("grpc.ssl_target_name_override", "localhost")]
        address = f"127.0.0.1:{served.port}"
        async with grpc.aio.secure_channel(address, pki.client_credentials(), options=options) as channel:
            stub = pb_grpc.AgentRuntimeStub(channel)
            await settle_one(stub, WRITE_TOKEN, "both")
            await unauthenticated(stub.List(pb.ListRequest(runtime_id="both")), "missing credentials")
            assert await health_check(channel) == health_pb2.HealthCheckResponse.SERVING


# ---- start-up: bad files and the insecure guard ----


def test_bad_tls_files_stop_the_start_with_a_clear_message(pki: Pki, tmp_path: Path) -> None:
    other_key = tmp_path / "other.key"
    trustme.CA().issue_cert("localhost").private_key_pem.write_to_path(str(other_key))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    missing = tmp_path / "missing.pem"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tls_cert": str(missing), "tls_key": str(pki.key)}, f"AGENTRUNTIME_TLS_CERT: cannot read {missing}: No such file"),
        ({"tls_cert": str(pki.cert)}, "AGENTRUNTIME_TLS_KEY is not set"),
        ({"tls_client_ca": str(pki.client_ca_file)}, "AGENTRUNTIME_TLS_CERT is not set"),
        ({"tls_cert": str(garbage), "tls_key": str(pki.key)}, f"AGENTRUNTIME_TLS_CERT: {garbage} holds no valid PEM certificate"),
        ({"tls_cert": str(pki.cert), "tls_key": str(garbage)}, f"AGENTRUNTIME_TLS_KEY: {garbage} holds no valid PEM private key"),
        ({"tls_cert": str(pki.cert), "tls_key": str(other_key)}, f"{other_key} is not the private key of the first certificate"),
        (
            {"tls_cert": str(pki.cert), "tls_key": str(pki.key), "tls_client_ca": str(garbage)},
            f"AGENTRUNTIME_TLS_CLIENT_CA: {garbage} holds no valid PEM CA certificate",
        ),
    ]
    secret = pki.key.read_text().splitlines()[1]
    for overrides, says in cases:
        with pytest.raises(StartupError) as caught:
            transport(server_settings(**overrides))
        assert says in str(caught.value), str(caught.value)
        assert secret not in str(caught.value)
    assert transport(server_settings(tls_cert=str(pki.cert), tls_key=str(pki.key))).mode == "tls"


def test_bad_auth_settings_stop_the_start_with_a_clear_message(tmp_path: Path) -> None:
    def bad(path: str, text: str) -> str:
        (tmp_path / path).write_text(text)
        return str(tmp_path / path)

    entry = {"tenant": "acme", "token_sha256": digest(READ_TOKEN), "scopes": ["read"], "name": "r"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"auth": "tokens"}, "AGENTRUNTIME_AUTH=tokens needs AGENTRUNTIME_AUTH_TOKENS_FILE"),
        ({"auth": "tokens", "auth_tokens_file": str(tmp_path / "none.json")}, "AGENTRUNTIME_AUTH_TOKENS_FILE: cannot read"),
        ({"auth": "tokens", "auth_tokens_file": bad("a.json", "{")}, "is not JSON"),
        ({"auth": "tokens", "auth_tokens_file": bad("b.json", "{}")}, "is not a JSON list"),
        (
            {"auth": "tokens", "auth_tokens_file": bad("c.json", json.dumps([{**entry, "token_sha256": READ_TOKEN}]))},
            "entry 0 ('r'): token_sha256 is not 64 hex digits",
        ),
        (
            {"auth": "tokens", "auth_tokens_file": bad("d.json", json.dumps([entry, entry]))},
            "repeats the token_sha256 of entry 0",
        ),
        ({"auth": "tokens", "auth_tokens_file": bad("e.json", json.dumps([{**entry, "scopes": ["admin"]}]))}, "unknown scope"),
        ({"auth": "tokens", "auth_tokens_file": bad("f.json", json.dumps([{**entry, "token": "x"}]))}, "unknown key(s) 'token'"),
        ({"auth": "jwt", "auth_jwks": "/x.json"}, "needs AGENTRUNTIME_AUTH_ISSUER, AGENTRUNTIME_AUTH_AUDIENCE"),
        (
            {"auth": "jwt", "auth_jwks": bad("g.json", '{"keys": []}'), "auth_issuer": ISSUER, "auth_audience": AUDIENCE},
            "holds no usable signing key",
        ),
        (
            {
                "auth": "jwt",
                "auth_jwks": bad("h.json", json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h", "alg": "HS256"}]})),
                "auth_issuer": ISSUER,
                "auth_audience": AUDIENCE,
            },
            "holds no usable signing key",
        ),
    ]
    for overrides, says in cases:
        with pytest.raises(StartupError) as caught:
            build_authenticator(server_settings(**overrides))
        assert says in str(caught.value), str(caught.value)
        assert READ_TOKEN not in str(caught.value)


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:0", True),
        ("127.9.9.9:1", True),
        ("[::1]:50051", True),
        ("localhost:50051", True),
        ("unix:/tmp/agentruntime.sock", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        (":50051", False),
        ("10.0.0.5:50051", False),
        ("example.test:50051", False),
    ],
)
def test_loopback_addresses(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


async def test_an_open_plaintext_server_without_auth_refuses_to_start(pki: Pki, tokens_file: Path) -> None:
    with pytest.raises(StartupError, match="AGENTRUNTIME_ALLOW_INSECURE=true") as caught:
        await start(server_settings(listen="0.0.0.0:0"))
    assert "refusing to serve 0.0.0.0:0 in plaintext without authentication" in str(caught.value)
    for overrides in (
        {"allow_insecure": True},
        {"tls_cert": str(pki.cert), "tls_key": str(pki.key)},
        {"auth": "tokens", "auth_tokens_file": str(tokens_file)},
    ):
        running = await start(server_settings(listen="0.0.0.0:0", **overrides))
        await running.stop(grace=None)


async def test_the_serve_command_prints_a_start_up_error_on_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTRUNTIME_METRICS_LISTEN": "off", "AGENTRUNTIME_STORE": "memory://"}
    missing = tmp_path / "cert.pem"
    runs = {
        f"error: AGENTRUNTIME_TLS_CERT: cannot read {missing}: No such file or directory": [
            "--listen", "127.0.0.1:0", "--tls-cert", str(missing), "--tls-key", str(missing),
        ],
        "error: refusing to serve 0.0.0.0:0 in plaintext without authentication": ["--listen", "0.0.0.0:0"],
        "error: AGENTRUNTIME_AUTH: Input should be 'none', 'tokens' or 'jwt'": [],
    }  # fmt: skip
    for says, arguments in runs.items():
        run_env = {**env, "AGENTRUNTIME_AUTH": "sometimes"} if not arguments else env
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentruntime_server", "serve", *arguments,
            env=run_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), 60)
        text = err.decode()
        assert process.returncode == 2, text
        assert text.startswith(says) and "Traceback" not in text, text
