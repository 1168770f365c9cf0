"""Authentication on a test server: the tokens file (a read and a write token of tenant acme), bearer
metadata, JWTs signed for a JWKS served on loopback, and a PKI for TLS and mTLS (trustme)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
import trustme
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support.loopback import Loopback

READ_TOKEN = "test-read-token-a1b2c3d4e5f6"
WRITE_TOKEN = "test-write-token-f6e5d4c3b2a1"
ISSUER = "https://issuer.test"
AUDIENCE = "agentruntime"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write_tokens(path: Path, *entries: tuple[str, str, list[str], str]) -> None:
    listed = [
        {"tenant": tenant, "token_sha256": digest(token), "scopes": scopes, "name": name}
        for tenant, token, scopes, name in entries
    ]
    path.write_text(json.dumps(listed))


READER = ("acme", READ_TOKEN, ["read"], "dashboard")
WRITER = ("acme", WRITE_TOKEN, ["read", "write"], "ci-bot")


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


async def refused(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def unauthenticated(call: Awaitable[Any], says: str, token: str = "") -> None:
    error = await refused(call)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
    assert says in (error.details() or ""), error.details()
    if token:
        assert token not in (error.details() or "")


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    write_tokens(path, READER, WRITER)
    return path


def public_jwk(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str, alg: str) -> dict[str, Any]:
    public = key.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
    else:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public))
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "svc-a", "tenant": "acme", "scope": "read write", "iat": now, "exp": now + 300}
    body.update(changes)
    return {name: value for name, value in body.items() if value is not None}


def sign(key: Any, kid: str = "k1", alg: str = "RS256", **changes: Any) -> str:
    return jwt.encode(claims(**changes), key, algorithm=alg, headers={"kid": kid})


class JwksServer(Loopback):
    def __init__(self, keys: list[dict[str, Any]]) -> None:
        self.keys = keys
        self.fetches = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/.well-known/jwks.json", self.jwks)

    async def jwks(self, request: web.Request) -> web.Response:
        self.fetches += 1
        return web.json_response({"keys": self.keys})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/jwks.json"


class Pki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = trustme.CA()
        leaf = self.ca.issue_cert("localhost", "127.0.0.1")
        self.cert = root / "server.pem"
        self.key = root / "server.key"
        self.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(self.key))
        self.client_ca = trustme.CA()
        self.client_ca_file = root / "client-ca.pem"
        self.client_ca.cert_pem.write_to_path(str(self.client_ca_file))

    def client_credentials(self, trusted: bool = True, client_of: trustme.CA | None = None) -> grpc.ChannelCredentials:
        chain = key = None
        if client_of is not None:
            client = client_of.issue_cert("client.test")
            chain = b"".join(blob.bytes() for blob in client.cert_chain_pems)
            key = client.private_key_pem.bytes()
        roots = self.ca.cert_pem.bytes() if trusted else None
        return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)
