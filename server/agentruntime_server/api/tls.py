"""Transport security at the edge: the server's TLS credentials (and mTLS), and the guard that
refuses to expose a plaintext, unauthenticated server beyond this machine.

The PEM files are read once, at start, and checked here (a certificate that parses, a key that
parses and matches it, CA certificates that parse), so a bad file stops the start with a message
naming the setting and the path, never at the first handshake. No message quotes a file's content."""

from __future__ import annotations

import datetime
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from ..settings import Settings, StartupError

if TYPE_CHECKING:
    from cryptography import x509

log = logging.getLogger(__name__)

MAX_PEM_BYTES = 1 << 20  # a certificate chain or a CA bundle is a few KiB; past this it is not one


@dataclass(frozen=True)
class Transport:
    """What the server binds with: credentials (None: plaintext) and a word for the log."""

    credentials: grpc.ServerCredentials | None
    mode: str  # "plaintext", "tls" or "mtls"


def read_pem(path: str, setting: str) -> bytes:
    """A PEM file's bytes, or a StartupError naming the setting and the path (not the content)."""
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_PEM_BYTES + 1)
    except OSError as error:
        raise StartupError(f"{setting}: cannot read {path}: {error.strerror or type(error).__name__}") from None
    if len(data) > MAX_PEM_BYTES:
        raise StartupError(f"{setting}: {path} is larger than {MAX_PEM_BYTES} bytes: not a PEM file")
    return data


def _certificates(data: bytes, path: str, setting: str, what: str) -> list[x509.Certificate]:
    from cryptography import x509  # only when TLS is on: cryptography costs ~15 MB at start

    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise StartupError(f"{setting}: {path} holds no valid PEM {what} ('-----BEGIN CERTIFICATE-----')") from None
    return certificates


def _public_bytes(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def transport(settings: Settings) -> Transport:
    """The server's transport from AGENTRUNTIME_TLS_*: plaintext, TLS, or TLS with client certificates."""
    if not (settings.tls_cert or settings.tls_key or settings.tls_client_ca):
        return Transport(None, "plaintext")
    from cryptography.hazmat.primitives import serialization  # only when TLS is on: ~15 MB at start

    if not settings.tls_cert or not settings.tls_key:
        missing = "AGENTRUNTIME_TLS_KEY" if settings.tls_cert else "AGENTRUNTIME_TLS_CERT"
        raise StartupError(
            f"{missing} is not set: TLS needs both AGENTRUNTIME_TLS_CERT (the certificate chain) and AGENTRUNTIME_TLS_KEY "
            "(its private key)" + ("; AGENTRUNTIME_TLS_CLIENT_CA (mTLS) needs them too" if settings.tls_client_ca else "")
        )
    chain = read_pem(settings.tls_cert, "AGENTRUNTIME_TLS_CERT")
    leaf = _certificates(chain, settings.tls_cert, "AGENTRUNTIME_TLS_CERT", "certificate")[0]
    key_pem = read_pem(settings.tls_key, "AGENTRUNTIME_TLS_KEY")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:  # encrypted: grpc cannot ask for a passphrase
        raise StartupError(
            f"AGENTRUNTIME_TLS_KEY: {settings.tls_key} is encrypted; give the key unencrypted (readable by this user only)"
        ) from None
    except Exception:  # ValueError, UnsupportedAlgorithm: never shown, the library's message may quote the bytes
        raise StartupError(f"AGENTRUNTIME_TLS_KEY: {settings.tls_key} holds no valid PEM private key") from None
    if _public_bytes(key.public_key()) != _public_bytes(leaf.public_key()):
        raise StartupError(
            f"AGENTRUNTIME_TLS_KEY: {settings.tls_key} is not the private key of the first certificate in {settings.tls_cert}"
        )
    expires = leaf.not_valid_after_utc
    if expires <= datetime.datetime.now(datetime.UTC):
        log.warning("the TLS certificate in %s expired at %s: clients will refuse it", settings.tls_cert, expires.isoformat())
    client_ca: bytes | None = None
    if settings.tls_client_ca:
        client_ca = read_pem(settings.tls_client_ca, "AGENTRUNTIME_TLS_CLIENT_CA")
        _certificates(client_ca, settings.tls_client_ca, "AGENTRUNTIME_TLS_CLIENT_CA", "CA certificate")
    credentials = grpc.ssl_server_credentials(
        [(key_pem, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
    return Transport(credentials, "mtls" if client_ca is not None else "tls")


def is_loopback(listen: str) -> bool:
    """Whether `listen` (a gRPC address: host:port, [v6]:port, :port, unix:path) is reachable
    only from this machine. An unknown host name counts as reachable from elsewhere."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return True
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    host = host.removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" (every interface) or a host name


def refuse_insecure(settings: Settings, transport: Transport) -> None:
    """A non-loopback plaintext server without authentication gives every caller on the network the
    `default` tenant with every right: refused unless AGENTRUNTIME_ALLOW_INSECURE=true says so."""
    if is_loopback(settings.listen):
        return
    if transport.credentials is None and settings.auth == "none":
        if settings.allow_insecure:
            log.warning(
                "serving %s in plaintext without authentication (AGENTRUNTIME_ALLOW_INSECURE=true): "
                "anyone who reaches the port is tenant 'default' with every right",
                settings.listen,
            )
            return
        raise StartupError(
            f"refusing to serve {settings.listen} in plaintext without authentication: anyone who reaches the port "
            "would be tenant 'default' with every right. Listen on a loopback address (127.0.0.1:PORT), or set "
            "AGENTRUNTIME_TLS_CERT/AGENTRUNTIME_TLS_KEY and AGENTRUNTIME_AUTH=tokens or jwt, or set "
            "AGENTRUNTIME_ALLOW_INSECURE=true to accept the exposure (a trusted network, a proxy that authenticates)"
        )
    if settings.auth == "none" and transport.mode == "tls":
        log.warning(
            "serving %s with AGENTRUNTIME_AUTH=none: any client that reaches the port is tenant 'default' with every "
            "right; set AGENTRUNTIME_AUTH=tokens or jwt, or AGENTRUNTIME_TLS_CLIENT_CA",
            settings.listen,
        )
    if transport.credentials is None:
        log.warning(
            "serving %s in plaintext: bearer credentials (AGENTRUNTIME_AUTH=%s) cross the network unencrypted; "
            "set AGENTRUNTIME_TLS_CERT/AGENTRUNTIME_TLS_KEY unless a proxy terminates TLS",
            settings.listen,
            settings.auth,
        )
