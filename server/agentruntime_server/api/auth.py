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
import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..domain.errors import PermissionDenied, Unauthenticated, shown
from ..settings import Settings, StartupError

log = logging.getLogger(__name__)

# RPCs a `read` scope may call; every other RPC needs `write`.
READ_METHODS = frozenset({"Inspect", "List", "ListRuntimes", "Wait", "Watch", "GetTranscript"})
SCOPES = frozenset({"read", "write"})
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TENANT_RULE = "letters, digits, '_', '.', '-', starting with a letter or digit, at most 64"
# Asymmetric algorithms only: a JWT is verified with a public key, so never `none`, and never
# HS* (whose secret would be a public key anyone can read, so anyone could sign).
RECHECK_SECONDS = 1.0  # a watched file is looked at (stat) at most this often
MAX_FILE_BYTES = 4 << 20
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
        raise Unauthenticated(f"missing credentials: {BEARER_HINT}")
    if len(values) > 1:
        raise Unauthenticated("more than one 'authorization' metadata entry: send exactly one")
    value = values[0]
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    scheme, _, token = text.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Unauthenticated(f"the 'authorization' metadata is not a bearer token: {BEARER_HINT}")
    token = token.strip()
    if not token:
        raise Unauthenticated(f"the bearer token is empty: {BEARER_HINT}")
    if len(token) > MAX_TOKEN_CHARS:
        raise Unauthenticated(f"the bearer token is longer than {MAX_TOKEN_CHARS} characters: not a valid token")
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


# ---- files watched for changes ----

T = TypeVar("T")
Signature = tuple[int, int, int, int]


def _signature(path: str) -> Signature:
    status = os.stat(path)
    return (status.st_mtime_ns, status.st_size, status.st_ino, status.st_dev)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"is larger than {MAX_FILE_BYTES} bytes")
    return data


class WatchedFile(Generic[T]):
    """A file parsed at start (a failure is a StartupError) and parsed again when it changes
    (its mtime, size or inode; looked at once every RECHECK_SECONDS at most). A version that
    cannot be read or parsed keeps the last good value and logs one warning.
    `parse` raises ValueError with a message that never quotes the content."""

    def __init__(self, path: str, setting: str, parse: Callable[[bytes], T]) -> None:
        self.path = path
        self.setting = setting
        self.parse = parse
        try:
            signature = _signature(path)
            self.value = parse(_read(path))
        except OSError as error:
            raise StartupError(f"{setting}: cannot read {path}: {error.strerror or type(error).__name__}") from None
        except ValueError as error:
            raise StartupError(f"{setting}: {path} {error}") from None
        self.signature = signature
        self.checked = time.monotonic()
        self.warned: object = None  # the bad version last warned about: one warning each

    def current(self) -> T:
        now = time.monotonic()
        if now - self.checked < RECHECK_SECONDS:
            return self.value
        self.checked = now
        try:
            signature = _signature(self.path)
            if signature == self.signature:
                self.warned = None  # back as it was: a new problem warns again
                return self.value
            value = self.parse(_read(self.path))
        except OSError as error:
            self._warn(("unreadable", error.errno), f"cannot read it ({error.strerror or type(error).__name__})")
            return self.value
        except ValueError as error:
            self._warn(signature, str(error))
            return self.value
        self.value, self.signature, self.warned = value, signature, None
        log.info("%s: %s changed; reloaded", self.setting, self.path)
        return value

    def _warn(self, version: object, problem: str) -> None:
        if version != self.warned:
            self.warned = version
            log.warning("%s: %s %s; still using the version read before", self.setting, self.path, problem)


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
QUOTA_KEYS = frozenset({"runtimes", "running_handles", "handles_per_minute", "store_bytes", "tokens_per_day"})


def json_file(data: bytes) -> Any:
    """A watched file's JSON; ValueError says why it is not (for the tokens file and a JWKS)."""
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"is not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None


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
                raise Unauthenticated("the bearer token has been revoked")
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
