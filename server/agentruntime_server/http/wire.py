"""What the HTTP client puts on the wire and reads back: a request's target and headers, the
reply (`Response`), and the errors an exchange ends in. No I/O here."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

Resolver = Callable[[str, int], Awaitable[list[str]]]
# The most of a body to read: a number of bytes, or one by the reply's status (a caller that
# wants an error's first lines but a whole output).
BodyLimit = int | Callable[[int], int]

MAX_HEADER_BYTES = 64 * 1024  # of a response's header block: a server past it is not speaking HTTP to us
MAX_HEADERS = 128
# A target's path and query go on the wire as ASCII: anything else is percent-encoded, and what
# is encoded already (or reserved) stays as it is.
_PATH_SAFE = "/%:@!$&'()*+,;=?~-._"
_CHARSET = re.compile(r";\s*charset=\"?([^\";\s]+)", re.IGNORECASE)
_BAD_HEADER_CHARS = re.compile(r"[\r\n\0]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class HttpError(Exception):
    """The exchange failed before a whole reply came: the message says how, never what was sent."""


class ConnectFailed(HttpError):
    """No connection could be made: the name did not resolve, nothing listened, TLS failed.
    `os_error` is the cause as the resolver or the socket gave it (an egress refusal is one)."""

    def __init__(self, message: str, os_error: OSError | None = None) -> None:
        super().__init__(message)
        self.os_error = os_error


class ConnectionLost(HttpError):
    """The connection closed before the reply was complete. `sent`: the request was on its way
    by then (written to the connection), so the server may have read it and acted on it; when
    False, no byte of it left this process."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class ReplyTimeout(TimeoutError):
    """The deadline passed after the request was written and before the reply was complete: the
    server may have read it and acted on it. (A deadline passed before that is a plain TimeoutError.)"""


class BadReply(HttpError):
    """What came back is not an HTTP/1.x reply this client reads."""


@dataclass(slots=True)
class Response:
    """A reply: its status, its headers (names lower-cased, repeated ones joined with ", "),
    and at most `max_body` bytes of its body (for its status), decoded. `truncated`: the body was longer; the
    rest was not read (and the connection was closed)."""

    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool = False

    @property
    def charset(self) -> str | None:
        match = _CHARSET.search(self.headers.get("content-type", ""))
        return match.group(1) if match else None


Origin = tuple[bool, str, int]  # (https, host, port): the pool a connection is kept in


@dataclass(frozen=True, slots=True)
class Target:
    origin: Origin  # its host as the resolver takes it: an IDNA name, or an IP address without brackets
    literal: bool  # the host is an IP address: nothing to resolve
    head: bytes  # "<METHOD> <path> HTTP/1.1" and the Host header, CRLF-terminated


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a URL's host names when it is an IP address (a zone id aside): such a host
    is connected to as it is, never resolved."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def parse_target(method: str, url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL (scheme {parts.scheme!r})")
    host = parts.hostname
    if not host:
        raise ValueError("the URL names no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL carries credentials")
    port = parts.port or (443 if parts.scheme == "https" else 80)  # a bad port raises ValueError
    secure = parts.scheme == "https"
    literal = ip_literal(host)
    if literal is not None:
        connect_host = host
        shown = f"[{literal}]" if literal.version == 6 else host  # without a zone id: it names our interface
    else:
        connect_host = host.encode("idna").decode("ascii")  # a UnicodeError is a ValueError
        shown = connect_host
    if port != (443 if secure else 80):
        shown = f"{shown}:{port}"
    path = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        path = f"{path}?{quote(parts.query, safe=_PATH_SAFE)}"
    head = f"{method} {path} HTTP/1.1\r\nHost: {shown}\r\n".encode("ascii")
    return Target((secure, connect_host, port), literal is not None, head)


def encode_headers(headers: Mapping[str, str]) -> bytes:
    """Header lines as they go on the wire. A name that is not a token, or a value holding a
    line break or a NUL, raises ValueError (and its text never quotes the value: it may be a
    secret)."""
    lines = []
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name[:64]!r} is not an HTTP token")
        if _BAD_HEADER_CHARS.search(value):
            raise ValueError(f"the value of header {name!r} holds a line break or a NUL")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("utf-8")
