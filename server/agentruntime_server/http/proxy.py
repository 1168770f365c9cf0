"""An HTTP proxy for model calls, as the providers' SDKs take it from the environment:
`HTTPS_PROXY` for https URLs, `HTTP_PROXY` for http ones (either name in lower case too),
`NO_PROXY` for the hosts that skip it (docs/configuration.md#proxies). A call goes through a
CONNECT tunnel: the proxy sees the host and port it opens, never the request (TLS, for an https
URL, is end to end, so the provider's key never reaches the proxy in the clear). Credentials in
the proxy's URL go in a Proxy-Authorization header of the CONNECT."""

from __future__ import annotations

import asyncio
import base64
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .wire import MAX_HEADER_BYTES, ConnectFailed, Origin


@dataclass(frozen=True, slots=True)
class Proxy:
    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization value, from the URL's credentials

    @property
    def shown(self) -> str:
        return f"{self.host}:{self.port}"  # never the credentials


class Proxies:
    """Which proxy, if any, a connection to an origin goes through."""

    def __init__(self, table: Mapping[str, str]) -> None:
        self._table = dict(table)  # urllib's: scheme -> URL, and "no" -> NO_PROXY
        self._by_scheme = {scheme: _parse(url, scheme) for scheme, url in self._table.items() if scheme in ("http", "https")}

    @classmethod
    def from_environment(cls) -> Proxies:
        return cls(urllib.request.getproxies_environment())

    def __bool__(self) -> bool:
        return bool(self._by_scheme)

    def for_origin(self, origin: Origin) -> Proxy | None:
        secure, host, port = origin
        proxy = self._by_scheme.get("https" if secure else "http")
        if proxy is None or urllib.request.proxy_bypass_environment(f"{host}:{port}", self._table):  # type: ignore[attr-defined]
            return None
        return proxy


def _parse(url: str, scheme: str) -> Proxy:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        # (An https:// proxy would need TLS inside TLS; the tunnel is TLS to the provider either way.)
        raise ValueError(f"{scheme.upper()}_PROXY must be an http:// URL with a host (the proxy is spoken to in plain HTTP)")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return Proxy(parts.hostname, parts.port or 80, authorization)


class _ConnectAnswer(asyncio.Protocol):
    """Reads the proxy's answer to a CONNECT: its header block, nothing after it (the tunnel's
    bytes are the next protocol's)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head = loop.create_future()
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end >= 0 and not self.head.done():
            self.head.set_result(bytes(self._buffer[: end + 4]))
        elif len(self._buffer) > MAX_HEADER_BYTES and not self.head.done():
            self.head.set_exception(OSError("the proxy's answer is not an HTTP header block"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(OSError("the proxy closed the connection before answering"))


async def tunnel(proxy: Proxy, origin: Origin) -> asyncio.WriteTransport:
    """A connection to the proxy, with the CONNECT to `origin` answered 2xx: the transport to
    speak to the origin through (set your protocol on it)."""
    _, host, port = origin
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    loop = asyncio.get_running_loop()
    try:
        transport, answer = await loop.create_connection(lambda: _ConnectAnswer(loop), proxy.host, proxy.port)
    except OSError as exc:
        raise ConnectFailed(f"cannot connect to the proxy {proxy.shown}: {exc}", exc) from exc
    head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
    if proxy.authorization is not None:
        head += f"Proxy-Authorization: {proxy.authorization}\r\n"
    transport.write(f"{head}\r\n".encode("ascii"))
    try:
        received = await answer.head
    except OSError as exc:
        transport.close()
        raise ConnectFailed(f"the proxy {proxy.shown} did not open a tunnel to {authority}: {exc}", exc) from exc
    except BaseException:
        transport.close()
        raise
    status = received.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].startswith(b"2"):
        transport.close()
        said = status[1].decode("ascii", "replace")[:3] if len(status) > 1 else "no status"
        error = OSError(f"the proxy answered {said}")
        raise ConnectFailed(f"the proxy {proxy.shown} refused a tunnel to {authority} (HTTP {said})", error)
    return transport
