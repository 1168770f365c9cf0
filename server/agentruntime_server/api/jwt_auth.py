"""AGENTRUNTIME_AUTH=jwt: bearer JWTs verified against a JWKS (a file re-read when it changes,
or an http(s) URL fetched in a thread and cached). Imported only in that mode."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import jwt

from ..domain.errors import Unauthenticated, Unavailable
from ..settings import StartupError
from .principals import SCOPES, TENANT_NAME, TENANT_RULE, BearerAuthenticator, Principal
from .watched_file import WatchedFile, json_file

log = logging.getLogger("agentruntime_server.api.auth")

# Asymmetric algorithms only: a JWT is verified with a public key, so never `none`, and never
# HS* (whose secret would be a public key anyone can read, so anyone could sign).
JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
JWT_LEEWAY_SECONDS = 30  # clock skew tolerated on exp, nbf and iat
JWKS_LIFESPAN_SECONDS = 300.0  # a fetched JWKS is used this long before it is fetched again
JWKS_COOLDOWN_SECONDS = 30.0  # an unknown `kid` refetches the JWKS at most this often
JWKS_TIMEOUT_SECONDS = 10.0  # a fetch's, in all
MAX_JWKS_BYTES = 1024 * 1024  # of a JWKS URL's answer (a JWKS is a few KiB)


def _signing_keys(keys: Sequence[jwt.PyJWK]) -> list[jwt.PyJWK]:
    """The keys a JWT may be verified with: for signatures, of an allowed (asymmetric) algorithm."""
    return [key for key in keys if key.public_key_use in ("sig", None) and key.algorithm_name in JWT_ALGORITHMS]


def parse_jwks(data: bytes) -> list[jwt.PyJWK]:
    document = json_file(data)
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


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is an answer that is not a JWKS


class _JwksClient(jwt.PyJWKClient):
    """An answer of the JWKS URL that is not a JWKS (an error page served with 200, JSON that is
    not an object) is the server's problem, as a JWKS without keys is: never the token's, nor
    INTERNAL. A connection broken while reading is one the URL cannot be reached over, and so
    is an answer longer than MAX_JWKS_BYTES or slower than JWKS_TIMEOUT_SECONDS in all (it is
    read no further). PyJWKClient's own fetch reads the whole answer, however long, and gives
    each read the timeout, however many there are."""

    def _fetch(self) -> Any:
        deadline = time.monotonic() + self.timeout
        request = urllib.request.Request(url=self.uri, headers=self.headers)
        try:
            with urllib.request.build_opener(_NoRedirects()).open(request, timeout=self.timeout) as response:
                chunks: list[bytes] = []
                size = 0
                while chunk := response.read1(64 * 1024):  # one read of the socket at most
                    size += len(chunk)
                    if size > MAX_JWKS_BYTES:
                        raise jwt.PyJWKClientConnectionError(f"its answer is longer than {MAX_JWKS_BYTES:,} bytes")
                    if time.monotonic() > deadline:
                        raise jwt.PyJWKClientConnectionError(f"its answer took longer than {self.timeout:g} s")
                    chunks.append(chunk)
        except (urllib.error.URLError, TimeoutError, http.client.HTTPException) as error:
            if isinstance(error, urllib.error.HTTPError):
                error.close()
            raise jwt.PyJWKClientConnectionError(f"it cannot be read ({error})") from None
        document = json.loads(b"".join(chunks))
        self._last_successful_fetch = time.monotonic()  # PyJWKClient's cooldown counts from here
        return self._as_jwk_set_payload(document)  # PyJWKClient.get_jwk_set caches what this returns

    def fetch_data(self) -> Any:
        try:
            return self._fetch()
        except jwt.PyJWKClientConnectionError:
            raise
        except OSError as error:
            raise jwt.PyJWKClientConnectionError(f"the connection broke: {type(error).__name__}") from None
        except ValueError as error:  # not JSON, or not UTF-8
            raise jwt.PyJWKSetError(f"its answer is not JSON ({type(error).__name__})") from None
        except jwt.PyJWKClientError:
            raise jwt.PyJWKSetError("its answer is not a JSON object") from None


class UrlKeys:
    """A JWKS URL through PyJWKClient: cached for JWKS_LIFESPAN_SECONDS, refetched for an unknown
    `kid` at most every JWKS_COOLDOWN_SECONDS, fetched in a thread (never on the event loop) and
    one fetch at a time."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.client = _JwksClient(
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
                raise Unavailable(
                    "the server cannot fetch its JWKS to verify the token; retry later", "AUTH_UNAVAILABLE", 5.0
                ) from None
            except jwt.PyJWKSetError as error:
                self._warn(f"it is not a JWKS with a usable key: {error}")
                raise Unavailable(
                    "the server's JWKS holds no usable key to verify the token; retry later", "AUTH_UNAVAILABLE", 5.0
                ) from None
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
            raise Unauthenticated("the JWT has expired", "expired") from None
        except jwt.ImmatureSignatureError as error:
            # PyJWT refuses a future `iat` and a future `nbf` alike; only its message tells them apart.
            if "(iat)" in str(error):
                raise Unauthenticated("the JWT was issued in the future ('iat')") from None
            raise Unauthenticated("the JWT is not valid yet ('nbf')") from None
        except jwt.InvalidIssuedAtError:
            raise Unauthenticated("the JWT's 'iat' is not a time (a whole number of seconds)") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("the JWT is for another audience ('aud')") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("the JWT is from another issuer ('iss')") from None
        except jwt.MissingRequiredClaimError as error:
            raise Unauthenticated(f"the JWT has no {error.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the JWT's signature does not verify with its key in the JWKS") from None
        except jwt.exceptions.InvalidSubjectError:
            raise Unauthenticated("the JWT's 'sub' claim is not a string") from None
        except jwt.exceptions.InvalidJTIError:
            raise Unauthenticated("the JWT's 'jti' claim is not a string") from None
        except jwt.InvalidAlgorithmError:
            raise Unauthenticated("the JWT's algorithm ('alg') is not its key's") from None
        except (jwt.InvalidKeyError, jwt.PyJWKError):
            raise Unauthenticated("the JWT's key in the JWKS cannot verify it") from None
        except jwt.DecodeError as error:
            # After the signature verified, PyJWT says a time claim is not a number the same way
            # it says the token does not decode; its message names the claim.
            for claim in ("exp", "nbf"):
                if f"({claim})" in str(error):
                    raise Unauthenticated(f"the JWT's {claim!r} is not a time (a whole number of seconds)") from None
            raise Unauthenticated("the bearer token is not a valid JWT") from None
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
