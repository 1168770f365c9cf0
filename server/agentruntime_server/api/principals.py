"""Who is calling, and what an authenticator is: the edge authenticates every RPC
(`Authenticator.authenticate`) into a Principal and hands the domain only its tenant.
Authenticator itself is AGENTRUNTIME_AUTH=none's; the bearer ones are in auth.py (tokens,
and `build_authenticator`, which picks the mode) and jwt_auth.py (jwt)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..domain.errors import PermissionDenied, Unauthenticated, shown

# RPCs a `read` scope may call; every other RPC needs `write`.
READ_METHODS = frozenset({"Inspect", "List", "ListRuntimes", "Wait", "Watch", "GetTranscript"})
SCOPES = frozenset({"read", "write"})
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TENANT_RULE = "letters, digits, '_', '.', '-', starting with a letter or digit, at most 64"
MAX_TOKEN_CHARS = 16 << 10  # a longer credential is refused unread
BEARER_HINT = "send the metadata 'authorization: Bearer <token>'"


@dataclass(frozen=True)
class Principal:
    tenant: str
    name: str = ""  # the token's or subject's name, for the audit log (never the credential)
    scopes: frozenset[str] = frozenset({"read", "write"})

    def describe(self) -> str:
        who = f"caller {shown(self.name)}" if self.name else "the caller"
        return f"{who} of tenant {shown(self.tenant)}"


DEFAULT = Principal("default")


def required_scope(method: str) -> str:
    return "read" if method in READ_METHODS else "write"


def authorize(principal: Principal, method: str) -> None:
    """PermissionDenied unless the principal's scopes allow `method` (`write` allows everything)."""
    needed = required_scope(method)
    if needed in principal.scopes or "write" in principal.scopes:
        return
    has = f"only the scope(s) {', '.join(sorted(principal.scopes))}" if principal.scopes else "no scope"
    refused = PermissionDenied(f"{method} needs the {needed!r} scope; {principal.describe()} has {has}")
    refused.principal = principal  # type: ignore[attr-defined]  # the audit line names who was refused
    raise refused


def bearer_token(metadata: Sequence[tuple[str, str | bytes]]) -> str:
    """The token of the one `authorization: Bearer <token>` metadata entry."""
    values = [value for key, value in metadata if key.lower() == "authorization"]
    if not values:
        raise Unauthenticated(f"missing credentials: {BEARER_HINT}", "missing")
    if len(values) > 1:
        raise Unauthenticated("more than one 'authorization' metadata entry: send exactly one", "malformed")
    value = values[0]
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    scheme, _, token = text.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Unauthenticated(f"the 'authorization' metadata is not a bearer token: {BEARER_HINT}", "malformed")
    token = token.strip()
    if not token:
        raise Unauthenticated(f"the bearer token is empty: {BEARER_HINT}", "malformed")
    if len(token) > MAX_TOKEN_CHARS:
        raise Unauthenticated(f"the bearer token is longer than {MAX_TOKEN_CHARS} characters: not a valid token", "malformed")
    return token


class Authenticator:
    """AGENTRUNTIME_AUTH=none: everyone is the default tenant."""

    mode = "none"

    async def authenticate(self, metadata: Sequence[tuple[str, str | bytes]], method: str) -> Principal:
        return DEFAULT

    def quotas_for(self, tenant: str) -> dict[str, int] | None:
        """A tenant's own quotas (the tokens file's `quotas`), over the server's; None: the server's."""
        return None


class BearerAuthenticator(Authenticator):
    """A bearer credential verified into a Principal, then its scopes checked against the method."""

    async def authenticate(self, metadata: Sequence[tuple[str, str | bytes]], method: str) -> Principal:
        principal = await self.verify(bearer_token(metadata))
        authorize(principal, method)
        return principal

    async def verify(self, token: str) -> Principal:
        raise NotImplementedError
