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

import asyncio
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

import jwt

from ..domain.errors import PermissionDenied, Unauthenticated, Unavailable, shown
from ..settings import Settings, StartupError

log = logging.getLogger(__name__)

# RPCs a `read` scope may call; every other RPC needs `write`.
READ_METHODS = frozenset({"Inspect", "List", "ListRuntimes", "Wait", "Watch", "GetTranscript"})
SCOPES = frozenset({"read", "write"})
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TENANT_RULE = "letters, digits, '_', '.', '-', starting with a letter or digit, at most 64"
# Asymmetric algorithms only: a JWT is verified with a public key, so never `none`, and never
# HS* (whose secret would be a public key anyone can read, so anyone could sign).
JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
JWT_LEEWAY_SECONDS = 30  # clock skew tolerated on exp, nbf and iat
JWKS_LIFESPAN_SECONDS = 300.0  # a fetched JWKS is used this long before it is fetched again
JWKS_COOLDOWN_SECONDS = 30.0  # an unknown `kid` refetches the JWKS at most this often
JWKS_TIMEOUT_SECONDS = 10.0
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
QUOTA_KEYS = frozenset({"runtimes", "running_handles", "tokens_per_day"})


def parse_tokens(data: bytes) -> TokenTable:
    """AGENTRUNTIME_AUTH_TOKENS_FILE's content, checked; ValueError names the entry and the problem."""
    try:
        listed = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"is not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
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


def _signing_keys(keys: Sequence[jwt.PyJWK]) -> list[jwt.PyJWK]:
    """The keys a JWT may be verified with: for signatures, of an allowed (asymmetric) algorithm."""
    return [key for key in keys if key.public_key_use in ("sig", None) and key.algorithm_name in JWT_ALGORITHMS]


def parse_jwks(data: bytes) -> list[jwt.PyJWK]:
    try:
        document = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"is not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError('is not a JWKS (a JSON object {"keys": [...]})')
    try:
        keys = _signing_keys(jwt.PyJWKSet.from_dict(document).keys)
    except jwt.PyJWTError:
        keys = []
    if not keys:
        raise ValueError(f"holds no usable signing key ({', '.join(JWT_ALGORITHMS)})")
    return keys


class FileKeys:
    """A JWKS file, re-read when it changes (keys rotate without a restart)."""

    def __init__(self, path: str) -> None:
        self.file = WatchedFile(path, "AGENTRUNTIME_AUTH_JWKS", parse_jwks)

    async def key(self, kid: str | None) -> jwt.PyJWK:
        keys = self.file.current()
        if kid is None:
            if len(keys) == 1:
                return keys[0]
            raise Unauthenticated("the JWT has no 'kid' header and the JWKS holds several keys")
        for key in keys:
            if key.key_id == kid:
                return key
        raise Unauthenticated("the JWT's key ('kid') is not in the JWKS")


class UrlKeys:
    """A JWKS URL through PyJWKClient: cached for JWKS_LIFESPAN_SECONDS, refetched for an unknown
    `kid` at most every JWKS_COOLDOWN_SECONDS, fetched in a thread (never on the event loop) and
    one fetch at a time."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.client = jwt.PyJWKClient(
                url,
                cache_jwk_set=True,
                lifespan=JWKS_LIFESPAN_SECONDS,
                timeout=JWKS_TIMEOUT_SECONDS,
                cooldown_duration=JWKS_COOLDOWN_SECONDS,
            )
        except jwt.PyJWKClientError as error:
            raise StartupError(f"AGENTRUNTIME_AUTH_JWKS: {error}") from None
        self.lock = asyncio.Lock()
        self.refreshed_at = -JWKS_COOLDOWN_SECONDS  # the last time an unknown kid made us fetch
        self.last_good: list[jwt.PyJWK] = []  # the keys last fetched: used while the URL cannot be reached
        self.warned = False

    def _cached(self, kid: str) -> tuple[bool, jwt.PyJWK | None]:
        """(a fresh JWKS is cached, its key `kid`) without blocking."""
        cache = self.client.jwk_set_cache
        jwk_set = cache.get() if cache is not None else None
        if jwk_set is None:
            return False, None
        return True, next((key for key in _signing_keys(jwk_set.keys) if key.key_id == kid), None)

    async def key(self, kid: str | None) -> jwt.PyJWK:
        if kid is None:
            raise Unauthenticated("the JWT has no 'kid' header naming its key in the JWKS")
        fresh, key = self._cached(kid)
        if key is not None:
            return key
        if fresh and time.monotonic() - self.refreshed_at < JWKS_COOLDOWN_SECONDS:
            raise Unauthenticated("the JWT's key ('kid') is not in the JWKS")
        async with self.lock:  # one fetch at a time; the others find its result in the cache
            fresh, key = self._cached(kid)
            if key is not None:
                return key
            if fresh:
                self.refreshed_at = time.monotonic()
            try:
                key = await asyncio.to_thread(self.client.get_signing_key, kid)
            except jwt.PyJWKClientConnectionError as error:
                stale = next((key for key in self.last_good if key.key_id == kid), None)
                self._warn(f"cannot fetch it: {error}" + ("; verifying with the keys fetched before" if stale else ""))
                if stale is not None:
                    return stale
                raise Unavailable("the server cannot fetch its JWKS to verify the token; retry later") from None
            except jwt.PyJWKSetError as error:
                self._warn(f"it holds no usable key: {error}")
                raise Unavailable("the server's JWKS holds no usable key to verify the token; retry later") from None
            except jwt.PyJWKClientError:
                raise Unauthenticated("the JWT's key ('kid') is not in the JWKS") from None
            cache = self.client.jwk_set_cache
            jwk_set = cache.get() if cache is not None else None
            self.last_good = _signing_keys(jwk_set.keys) if jwk_set is not None else [key]
        self.warned = False
        if key.public_key_use not in ("sig", None) or key.algorithm_name not in JWT_ALGORITHMS:
            raise Unauthenticated("the JWT's key in the JWKS is not a signing key of an allowed algorithm")
        return key

    def _warn(self, problem: str) -> None:
        if not self.warned:
            self.warned = True
            log.warning("AGENTRUNTIME_AUTH_JWKS: %s: %s", self.url, problem)


class JwtAuthenticator(BearerAuthenticator):
    mode = "jwt"

    def __init__(self, keys: FileKeys | UrlKeys, issuer: str, audience: str, tenant_claim: str) -> None:
        self.keys = keys
        self.issuer = issuer
        self.audience = audience
        self.tenant_claim = tenant_claim

    async def verify(self, token: str) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is not a valid JWT") from None
        if header.get("alg") not in JWT_ALGORITHMS:
            raise Unauthenticated(f"the JWT's algorithm ('alg') is not one this server accepts ({', '.join(JWT_ALGORITHMS)})")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise Unauthenticated("the JWT's 'kid' header is not a string")
        key = await self.keys.key(kid)
        claims = self._decode(token, key)
        tenant = claims.get(self.tenant_claim)
        if tenant is None:
            raise Unauthenticated(f"the JWT has no {self.tenant_claim!r} claim naming the tenant")
        if not isinstance(tenant, str) or not TENANT_NAME.fullmatch(tenant):
            raise Unauthenticated(f"the JWT's {self.tenant_claim!r} claim is not a tenant name ({TENANT_RULE})")
        subject = claims.get("sub")
        return Principal(tenant, subject if isinstance(subject, str) else "", _scopes(claims))

    def _decode(self, token: str, key: jwt.PyJWK) -> dict[str, Any]:
        try:
            return jwt.decode(
                token,
                key=key,
                algorithms=list(JWT_ALGORITHMS),
                audience=self.audience,
                issuer=self.issuer,
                leeway=JWT_LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"], "enforce_minimum_key_length": True},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the JWT has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("the JWT is not valid yet ('nbf')") from None
        except jwt.InvalidIssuedAtError:
            raise Unauthenticated("the JWT's 'iat' is not a time in the past") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("the JWT is for another audience ('aud')") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("the JWT is from another issuer ('iss')") from None
        except jwt.MissingRequiredClaimError as error:
            raise Unauthenticated(f"the JWT has no {error.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the JWT's signature does not verify with its key in the JWKS") from None
        except jwt.InvalidAlgorithmError:
            raise Unauthenticated("the JWT's algorithm ('alg') is not its key's") from None
        except (jwt.InvalidKeyError, jwt.PyJWKError):
            raise Unauthenticated("the JWT's key in the JWKS cannot verify it") from None
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is not a valid JWT") from None


def _scopes(claims: dict[str, Any]) -> frozenset[str]:
    """`scope` (space-separated, RFC 8693) or `scp` (a list, or a space-separated string)."""
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        names = raw.split()
    elif isinstance(raw, list):
        names = [name for name in raw if isinstance(name, str)]
    else:
        names = []
    return frozenset(names) & SCOPES


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
        source = settings.auth_jwks
        if source.lower().startswith(("http://", "https://")):
            keys: FileKeys | UrlKeys = UrlKeys(source)
        else:
            keys = FileKeys(source.removeprefix("file://"))
        return JwtAuthenticator(keys, settings.auth_issuer, settings.auth_audience, settings.auth_tenant_claim)
    return Authenticator()
