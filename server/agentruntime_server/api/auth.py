"""Who is calling: the edge authenticates every RPC and hands the domain only a tenant.

`Authenticator.authenticate(metadata, method)` returns the caller's Principal, or raises
Unauthenticated (no, bad, revoked or expired credentials) or PermissionDenied (a caller without
the `write` scope attempting a mutating RPC). `build_authenticator(settings)` picks the mode:

- AGENTRUNTIME_AUTH=none: every caller is the `default` tenant with every scope.
- tokens: `authorization: Bearer <token>` checked against AGENTRUNTIME_AUTH_TOKENS_FILE, a JSON
  list of `{"tenant", "token_sha256", "scopes", "name"}` (only hashes on disk). The file is
  re-read when it changes (looked at once a second at most): a token is revoked without a
  restart. A version that does not parse keeps the last good one and logs one warning.
- jwt: bearer JWTs verified against AGENTRUNTIME_AUTH_JWKS (an http(s) URL, fetched in a thread
  and cached, or a file re-read when it changes), with the issuer and audience required; the
  tenant is the claim AGENTRUNTIME_AUTH_TENANT_CLAIM names, scopes come from `scope` or `scp`.

No message, log line or error ever quotes a credential."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass

from ..domain.errors import Unauthenticated, shown
from ..settings import Settings, StartupError
from .principals import SCOPES, TENANT_NAME, TENANT_RULE, Authenticator, BearerAuthenticator, Principal
from .watched_file import WatchedFile, json_file

log = logging.getLogger(__name__)

# ---- AUTH=tokens ----


@dataclass(frozen=True)
class TokenEntry:
    digest: bytes  # sha256 of the token
    principal: Principal
    tenant_valid: bool  # False: the entry's tenant is not a tenant name, its token is refused
    quotas: dict[str, int] | None = None  # the tenant's own quotas, when this entry sets them


@dataclass(frozen=True)
class TokenTable:
    entries: tuple[TokenEntry, ...]

    @property
    def digests(self) -> frozenset[bytes]:
        return frozenset(entry.digest for entry in self.entries)


ENTRY_KEYS = frozenset({"tenant", "token_sha256", "scopes", "name", "quotas"})
QUOTA_KEYS = frozenset(
    {
        "runtimes",
        "running_handles",
        "handles_per_minute",
        "store_bytes",
        "tokens_per_day",
        "cost_per_day",
        "watch_streams",
        "worker_streams",
    }
)


def parse_tokens(data: bytes) -> TokenTable:
    """AGENTRUNTIME_AUTH_TOKENS_FILE's content, checked; ValueError names the entry and the problem."""
    listed = json_file(data)
    if not isinstance(listed, list):
        raise ValueError('is not a JSON list of {"tenant", "token_sha256", "scopes", "name"} objects')
    entries: list[TokenEntry] = []
    seen: dict[bytes, int] = {}
    for index, item in enumerate(listed):
        if not isinstance(item, dict):
            raise ValueError(f"entry {index} is not an object")
        name = item.get("name", "")
        label = f"entry {index}" + (f" ({shown(name)})" if isinstance(name, str) and name else "")
        unknown = sorted(set(item) - ENTRY_KEYS)
        if unknown:
            raise ValueError(f"{label} has unknown key(s) {', '.join(shown(str(key), 32) for key in unknown)}")
        if not isinstance(name, str):
            raise ValueError(f"{label}: name is not a string")
        hexdigest = item.get("token_sha256")
        if not isinstance(hexdigest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hexdigest):
            raise ValueError(f"{label}: token_sha256 is not 64 hex digits (the SHA-256 of the token, never the token)")
        digest = bytes.fromhex(hexdigest)
        if digest in seen:
            raise ValueError(f"{label} repeats the token_sha256 of entry {seen[digest]}")
        seen[digest] = index
        tenant = item.get("tenant")
        if not isinstance(tenant, str):
            raise ValueError(f"{label}: tenant is missing or not a string")
        scopes = item.get("scopes")
        if not isinstance(scopes, list) or not all(isinstance(scope, str) for scope in scopes):
            raise ValueError(f'{label}: scopes is missing or not a list of strings ("read", "write")')
        strange = sorted(set(scopes) - SCOPES)
        if strange:
            raise ValueError(f"{label}: unknown scope(s) {', '.join(shown(scope, 32) for scope in strange)}; known: read, write")
        tenant_valid = TENANT_NAME.fullmatch(tenant) is not None
        if not tenant_valid:
            log.warning(
                "AGENTRUNTIME_AUTH_TOKENS_FILE: %s: tenant is not a tenant name (%s); its token is refused", label, TENANT_RULE
            )
        quotas = item.get("quotas")
        if quotas is not None and (
            not isinstance(quotas, dict)
            or not set(quotas) <= QUOTA_KEYS
            or not all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in quotas.values())
        ):
            raise ValueError(f"{label}: quotas must map {', '.join(sorted(QUOTA_KEYS))} to whole numbers >= 0")
        entries.append(TokenEntry(digest, Principal(tenant, name, frozenset(scopes)), tenant_valid, quotas))
    return TokenTable(tuple(entries))


class TokenAuthenticator(BearerAuthenticator):
    mode = "tokens"

    def __init__(self, path: str) -> None:
        self.file = WatchedFile(path, "AGENTRUNTIME_AUTH_TOKENS_FILE", parse_tokens)
        self.table = self.file.value
        self.revoked: set[bytes] = set()  # digests a reload removed: their tokens say "revoked"

    def _current(self) -> TokenTable:
        table = self.file.current()
        if table is not self.table:
            self.revoked = (self.revoked | self.table.digests) - table.digests
            self.table = table
        return table

    def quotas_for(self, tenant: str) -> dict[str, int] | None:
        for entry in self._current().entries:
            if entry.principal.tenant == tenant and entry.quotas is not None:
                return entry.quotas
        return None

    async def verify(self, token: str) -> Principal:
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found: TokenEntry | None = None
        for entry in self._current().entries:  # every digest compared, in constant time each
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        if found is None:
            if digest in self.revoked:
                raise Unauthenticated("the bearer token has been revoked", "revoked")
            raise Unauthenticated("the bearer token is not valid (no such token)")
        if not found.tenant_valid:
            raise Unauthenticated(f"the bearer token's tenant is not a tenant name ({TENANT_RULE})")
        return found.principal


# ---- AUTH=jwt ----


def build_authenticator(settings: Settings) -> Authenticator:
    """The authenticator AGENTRUNTIME_AUTH names; its files are read now (StartupError if bad)."""
    if settings.auth == "tokens":
        if not settings.auth_tokens_file:
            raise StartupError(
                "AGENTRUNTIME_AUTH=tokens needs AGENTRUNTIME_AUTH_TOKENS_FILE: a JSON list of "
                '{"tenant", "token_sha256", "scopes", "name"}'
            )
        return TokenAuthenticator(settings.auth_tokens_file)
    if settings.auth == "jwt":
        missing = [
            name
            for name, value in (
                ("AGENTRUNTIME_AUTH_JWKS", settings.auth_jwks),
                ("AGENTRUNTIME_AUTH_ISSUER", settings.auth_issuer),
                ("AGENTRUNTIME_AUTH_AUDIENCE", settings.auth_audience),
            )
            if not value
        ]
        if missing:
            raise StartupError(f"AGENTRUNTIME_AUTH=jwt needs {', '.join(missing)}")
        from .jwt_auth import FileKeys, JwtAuthenticator, UrlKeys  # PyJWT and cryptography: ~20 MB, only for jwt

        source = settings.auth_jwks
        if source.lower().startswith(("http://", "https://")):
            keys: FileKeys | UrlKeys = UrlKeys(source)
        else:
            keys = FileKeys(source.removeprefix("file://"))
        return JwtAuthenticator(keys, settings.auth_issuer, settings.auth_audience, settings.auth_tenant_claim)
    return Authenticator()
