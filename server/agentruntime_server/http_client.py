"""The HTTP/1.1 client of the runtime's two hot outbound paths: model calls (providers/) and
http tools (tools/http.py). Each has its own `HttpClient`: its own keep-alive pool, and for
the tools a resolver under the egress policy.

Why not aiohttp, which this replaced: on the 2-core development machine aiohttp 3.14 spent
70-100 µs of CPU a request at 20 requests in flight, a third of the server's whole cost per
model turn then; this client spends 20-37 µs, because a request here is one write and one
future, with no task, no timer of its own, no cookie jar, tracing hooks or redirect loop
(`bench/http_clients.py`; README, Performance). pyreqwest (Rust) was as cheap in an idle
loop, and no cheaper than aiohttp in a busy one: its replies cross threads.
The protocol itself is not ours: responses are parsed by llhttp (Node's parser, through
MagicStack's `httptools`), TLS is the `ssl` module's, connections are the event loop's.

What it does, and no more: POST (or any method) with a body of known length, over
`http://` or `https://` (certificates verified against the system's roots, which
SSL_CERT_FILE / SSL_CERT_DIR extend); responses by Content-Length, chunked, or until the
connection closes; 1xx interim responses skipped; gzip and deflate bodies decoded (not
asked for: `Accept-Encoding: identity` is sent); a bounded body (the rest is never read);
one deadline for the whole exchange (a free connection, connecting, sending, the reply);
keep-alive connections reused newest first and dropped after `keepalive` seconds idle;
at most `pool_size` connections open. No redirects are followed, no proxy is used, no
cookie is kept: none of them belongs on these paths."""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import re
import socket
import ssl
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import cast
from urllib.parse import quote, urlsplit

import httptools

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
    """The connection closed before the reply was complete."""


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
class _Target:
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


def _target(method: str, url: str) -> _Target:
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
    return _Target((secure, connect_host, port), literal is not None, head)


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


class _Connection(asyncio.Protocol):
    """One keep-alive connection, and the reply it is reading (one at a time)."""

    def __init__(self, client: HttpClient, origin: Origin) -> None:
        self.client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Response] | None = None
        self.retired = False  # closed (by either side): its pool slot is given back
        self.idle_since = 0.0
        self._reset(0)

    def _reset(self, limit: BodyLimit) -> None:
        self.limit = limit
        self.max_body = limit if isinstance(limit, int) else 0  # known with the status
        self.reusable = False  # set by a whole reply that keeps the connection alive
        self.done = False  # the reply is read (or failed): anything more from the server is a fault
        self.status = 0
        self.interim = False
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.header_count = 0
        self.headers_done = False
        self.framed = False  # Content-Length or chunked: the end of the body is known before EOF
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.decoder: zlib._Decompress | None = None
        self.encoding = ""

    # ---- asyncio ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport's subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._retire(self)
        if self.waiter is None or self.done:
            return
        if self.headers_done and not self.framed and not self.interim:
            self._finish()  # a body read until the connection closes ends here
        else:
            cause = f" ({exc})" if exc else ""
            self._fail(ConnectionLost(f"the connection closed before the reply was complete{cause}"))

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.done:
            # Nothing was asked: a server speaking out of turn (or past a reply's end) cannot
            # be trusted with the next request.
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadReply("the server switched protocols"))
        except httptools.HttpParserError as exc:
            raised = exc.__context__
            self._fail(raised if isinstance(raised, HttpError) else BadReply(f"the reply is not HTTP/1.x ({exc})"))
        if self.done and not self.reusable:
            self.close()

    # ---- llhttp's callbacks (an HttpError raised here stops the parser) --------------------

    def on_message_begin(self) -> None:
        if self.done:
            raise BadReply("the server sent more than it was asked for")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        self.header_count += 1
        if self.header_bytes > MAX_HEADER_BYTES or self.header_count > MAX_HEADERS:
            raise BadReply(f"the reply's headers exceed {MAX_HEADERS} fields or {MAX_HEADER_BYTES} bytes")
        key = name.decode("latin-1").lower()
        text = value.decode("utf-8", "replace")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim reply (100 Continue, 103 Early Hints): the real one follows
            self.interim = True
            self.headers = {}
            return
        self.status = status
        if not isinstance(self.limit, int):
            self.max_body = self.limit(status)
        self.headers_done = True
        headers = self.headers
        self.framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        self.encoding = headers.get("content-encoding", "").strip().lower()
        if self.encoding == "gzip":
            self.decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def on_body(self, body: bytes) -> None:
        if self.done or self.interim:
            return
        if self.encoding == "deflate" and self.decoder is None:
            # "deflate" is zlib's format by the RFC, raw deflate from some servers: the header tells.
            wrapped = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
            self.decoder = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        if self.decoder is not None:
            try:
                # At most one byte past the limit: enough to know the body is over it.
                body = self.decoder.decompress(body, self.max_body + 1 - self.size)
            except zlib.error as exc:
                raise BadReply(f"the {self.encoding} body does not decode ({exc})") from None
        self.chunks.append(body)
        self.size += len(body)
        if self.size > self.max_body:
            self.truncated = True  # the rest is never read: the connection closes
            self._finish()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            self.header_bytes = self.header_count = 0
            return
        if self.done:
            return
        self.reusable = self.parser.should_keep_alive()
        self._finish()

    # ---- one exchange ---------------------------------------------------------------------

    def _finish(self) -> None:
        self.done = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        body = b"".join(self.chunks)
        if len(body) > self.max_body:
            body = body[: self.max_body]
        waiter.set_result(Response(self.status, self.headers, body, self.truncated))

    def _fail(self, error: BaseException) -> None:
        self.done = True
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    def _time_out(self) -> None:
        self._fail(TimeoutError())
        self.close()

    async def exchange(self, request: bytes, max_body: BodyLimit, deadline: float) -> Response:
        client = self.client
        if self.retired:
            raise ConnectionLost("the connection closed before the request was sent")
        self._reset(max_body)
        waiter: asyncio.Future[Response] = client.loop.create_future()
        self.waiter = waiter
        assert self.transport is not None
        self.transport.write(request)
        client._watch(self, deadline)
        try:
            return await waiter
        except BaseException:
            self.reusable = False  # cancelled, timed out or failed mid-reply: what it holds is unknown
            raise
        finally:
            client._exchanges.pop(self, None)
            self.waiter = None
            client._release(self)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.client._retire(self)


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, each once, in the system resolver's order. It runs
    socket.getaddrinfo in the loop's executor, as asyncio's own loop.getaddrinfo does, on
    any event loop (uvloop's would call the C library directly)."""
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(None, socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _user_agent() -> str:
    try:
        return f"agentruntime/{metadata.version('agentruntime-server')}"
    except metadata.PackageNotFoundError:
        return "agentruntime"


class HttpClient:
    """A keep-alive pool and the requests made through it. Made outside the event loop; used
    inside one (its first request binds it)."""

    def __init__(
        self,
        pool_size: int = 256,
        *,
        keepalive: float = 30.0,
        resolver: Resolver = system_resolver,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.pool_size = max(pool_size, 1)
        self.keepalive = keepalive
        self._resolver = resolver
        self._ssl = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._live: set[_Connection] = set()  # connected, not yet retired
        self._opening = 0  # connections being made
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()  # for a free slot
        self._targets: dict[tuple[str, str], _Target] = {}
        # Exchanges under way, by connection -> their deadline. One timer watches them all, set
        # for the earliest: a timer a request (set, then cancelled) cost 2-3 µs of its ~20.
        self._exchanges: dict[_Connection, float] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0
        self._user_agent = f"User-Agent: {_user_agent()}\r\nAccept-Encoding: identity\r\n".encode()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    @property
    def connections(self) -> int:
        """Connections open or being made."""
        return len(self._live) + self._opening

    def _target(self, method: str, url: str) -> _Target:
        key = (method, url)
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) >= 4096:
                self._targets.clear()
            target = self._targets[key] = _target(method, url)
        return target

    async def request(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: bytes | Mapping[str, str],
        *,
        timeout: float,
        max_body: BodyLimit,
    ) -> Response:
        """One exchange. `headers` as a mapping, or as `encode_headers` made them once (a
        provider's never change); Host, Content-Length, User-Agent and Accept-Encoding are
        the client's. Raises ValueError for a URL or a header it will not send, TimeoutError
        past `timeout` seconds, and an HttpError for the rest."""
        if self.closed:
            raise ConnectionLost("the client is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        target = self._target(method, url)
        lines = headers if isinstance(headers, bytes) else encode_headers(headers)
        request = b"%s%s%sContent-Length: %d\r\n\r\n%s" % (target.head, lines, self._user_agent, len(body), body)
        connection = self._reused(target.origin, loop.time())
        if connection is None:
            connection = await self._connect(target, deadline)
        return await connection.exchange(request, max_body, deadline)

    async def post(
        self, url: str, body: bytes, headers: bytes | Mapping[str, str], *, timeout: float, max_body: BodyLimit
    ) -> Response:
        return await self.request("POST", url, body, headers, timeout=timeout, max_body=max_body)

    # ---- deadlines ---------------------------------------------------------------------------

    def _watch(self, connection: _Connection, deadline: float) -> None:
        self._exchanges[connection] = deadline
        if self._sweep is None or deadline < self._sweep_at:
            if self._sweep is not None:
                self._sweep.cancel()
            self._sweep_at = deadline
            self._sweep = self.loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """The earliest deadline came: every exchange past its own fails; the timer is set again
        for the earliest left."""
        self._sweep = None
        now = self.loop.time() + 0.001  # a timer may fire a little early (uvloop's count in ms)
        for connection, deadline in list(self._exchanges.items()):
            if deadline <= now:
                del self._exchanges[connection]
                connection._time_out()
        if self._exchanges:
            self._sweep_at = min(self._exchanges.values())
            self._sweep = self.loop.call_at(self._sweep_at, self._expire)

    # ---- the pool ---------------------------------------------------------------------------

    def _reused(self, origin: Origin, now: float) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.retired and now - connection.idle_since < self.keepalive:
                return connection
            connection.close()  # stale
        return None

    async def _connect(self, target: _Target, deadline: float) -> _Connection:
        async with asyncio.timeout_at(deadline):
            while self.connections >= self.pool_size:
                if self._close_an_idle_one():
                    continue
                waiting = self.loop.create_future()
                self._waiting.append(waiting)
                try:
                    await waiting
                except BaseException:
                    if waiting.done() and not waiting.cancelled():
                        self._wake_one()  # woken, then stopped: the free slot is someone else's
                    elif waiting in self._waiting:
                        self._waiting.remove(waiting)
                    raise
                connection = self._reused(target.origin, self.loop.time())
                if connection is not None:
                    return connection
            self._opening += 1
            try:
                connection = await self._open_connection(target)
            except BaseException:
                self._wake_one()
                raise
            finally:
                self._opening -= 1
            if not connection.retired:  # not lost already
                self._live.add(connection)
            return connection

    async def _open_connection(self, target: _Target) -> _Connection:
        secure, host, port = target.origin
        if target.literal:
            addresses = [host]
        else:
            try:
                addresses = await self._resolver(host, port)
            except OSError as exc:
                raise ConnectFailed(f"cannot resolve {host}: {exc}", exc) from exc
            if not addresses:
                error = OSError(f"{host} resolves to no address")
                raise ConnectFailed(str(error), error)
        context = None
        if secure:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        failures: list[tuple[str, OSError]] = []
        for address in addresses:
            try:
                _, connection = await self.loop.create_connection(
                    functools.partial(_Connection, self, target.origin),
                    address,
                    port,
                    ssl=context,
                    server_hostname=host if secure else None,
                )
            except OSError as exc:  # ssl.SSLError is one too
                failures.append((address, exc))
                continue
            return connection
        tried = "; ".join(f"at {address}: {exc}" for address, exc in failures)
        raise ConnectFailed(f"cannot connect to {host}:{port} {tried}", failures[-1][1]) from failures[-1][1]

    def _release(self, connection: _Connection) -> None:
        """An exchange is over: the connection waits in its pool for the next one, or closes."""
        if not connection.reusable or connection.retired or self.closed:
            connection.close()
            return
        connection.idle_since = self.loop.time()
        self._idle.setdefault(connection.origin, []).append(connection)
        if self._waiting:
            self._wake_one()  # a request waiting for a slot takes this connection, or closes it for its own

    def _retire(self, connection: _Connection) -> None:
        """A connection closed (by either side): its pool slot is free."""
        if connection.retired:
            return
        connection.retired = True
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)
        self._live.discard(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiting = self._waiting.popleft()
            if not waiting.done():
                waiting.set_result(None)
                return

    def _close_an_idle_one(self) -> bool:
        oldest: _Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        oldest.close()
        return True

    async def close(self) -> None:
        """Closes every idle connection; those in use close when their exchange ends."""
        self.closed = True
        if self._sweep is not None and not self._exchanges:
            self._sweep.cancel()
            self._sweep = None
        for idle in list(self._idle.values()):
            for connection in list(idle):
                connection.close()
        self._idle.clear()
        await asyncio.sleep(0)  # the transports' close callbacks run
