"""JWT refusals under review: each names its own reason (PyJWT raises one error for a future
`iat` and a future `nbf`), never quoting the token; a JWKS URL whose answer is not a JWKS, or
whose connection resets mid-answer, is the server's problem (UNAVAILABLE), not the token's and
not INTERNAL. Real servers on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.api import jwt_auth
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.api.test_security import jwt_server, rsa_key, signer
from tests.support.auth import AUDIENCE, ISSUER, bearer, public_jwk, refused, sign, unauthenticated
from tests.support.loopback import Loopback
from tests.support.servers import Served, serve

__all__ = ["jwt_server", "signer"]  # test_security's fixtures, used here


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
