"""The keep-alive pool and the requests made through it (see the package's text)."""

from __future__ import annotations

import asyncio
import collections
import functools
import socket
import ssl
from collections.abc import Callable, Mapping
from importlib import metadata

from .connection import Connection
from .proxy import Proxies, Proxy, tunnel
from .wire import BodyLimit, ConnectFailed, ConnectionLost, Origin, Resolver, Response, Target, encode_headers, parse_target


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, each once, in the system resolver's order. It runs
    socket.getaddrinfo in the loop's executor, as asyncio's own loop.getaddrinfo does, on
    any event loop (uvloop's would call the C library directly)."""
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(None, socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def user_agent() -> str:
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
        proxies: Proxies | None = None,
    ) -> None:
        """`proxies`: the HTTP proxy each origin goes through (http/proxy.py); None: none."""
        self.pool_size = max(pool_size, 1)
        self.keepalive = keepalive
        self._resolver = resolver
        self._ssl = ssl_context
        self._proxies = proxies if proxies else None
        self._idle: dict[Origin, list[Connection]] = {}
        self._live: set[Connection] = set()  # connected, not yet retired
        self._opening = 0  # connections being made
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()  # for a free slot
        self._targets: dict[tuple[str, str], Target] = {}
        # Exchanges under way, by connection -> their deadline. One timer watches them all, set
        # for the earliest: a timer a request (set, then cancelled) cost 2-3 µs of its ~20.
        self._exchanges: dict[Connection, float] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0
        self._user_agent = f"User-Agent: {user_agent()}\r\nAccept-Encoding: identity\r\n".encode()
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

    def _target(self, method: str, url: str) -> Target:
        key = (method, url)
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) >= 4096:
                self._targets.clear()
            target = self._targets[key] = parse_target(method, url)
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
        sink: Callable[[bytes], None] | None = None,
    ) -> Response:
        """One exchange. `headers` as a mapping, or as `encode_headers` made them once (a
        provider's never change); Host, Content-Length, User-Agent and Accept-Encoding are
        the client's. Raises ValueError for a URL or a header it will not send, TimeoutError
        past `timeout` seconds (ReplyTimeout once the request was written), and an HttpError
        for the rest (ConnectionLost says whether the request was written). With `sink`, a
        2xx reply's body is handed to it piece by piece as it arrives (decoded; the
        Response's body is then empty): a streamed reply. `sink` must not raise."""
        if self.closed:
            raise ConnectionLost("the client is closed", sent=False)
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
        return await connection.exchange(request, max_body, deadline, sink)

    async def post(
        self,
        url: str,
        body: bytes,
        headers: bytes | Mapping[str, str],
        *,
        timeout: float,
        max_body: BodyLimit,
        sink: Callable[[bytes], None] | None = None,
    ) -> Response:
        return await self.request("POST", url, body, headers, timeout=timeout, max_body=max_body, sink=sink)

    # ---- deadlines ---------------------------------------------------------------------------

    def watch(self, connection: Connection, deadline: float) -> None:
        """An exchange on `connection` must be over by `deadline` (one timer for all: the earliest)."""
        self._exchanges[connection] = deadline
        if self._sweep is None or deadline < self._sweep_at:
            if self._sweep is not None:
                self._sweep.cancel()
            self._sweep_at = deadline
            self._sweep = self.loop.call_at(deadline, self._expire)

    def unwatch(self, connection: Connection) -> None:
        """The exchange on `connection` is over: its deadline no longer counts."""
        self._exchanges.pop(connection, None)

    def _expire(self) -> None:
        """The earliest deadline came: every exchange past its own fails; the timer is set again
        for the earliest left."""
        self._sweep = None
        now = self.loop.time() + 0.001  # a timer may fire a little early (uvloop's count in ms)
        for connection, deadline in list(self._exchanges.items()):
            if deadline <= now:
                del self._exchanges[connection]
                connection.time_out()
        if self._exchanges:
            self._sweep_at = min(self._exchanges.values())
            self._sweep = self.loop.call_at(self._sweep_at, self._expire)

    # ---- the pool ---------------------------------------------------------------------------

    def _reused(self, origin: Origin, now: float) -> Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.retired and now - connection.idle_since < self.keepalive and not connection.closing:
                return connection
            connection.close()  # stale, or closed by the server (its connection_lost still to come)
        return None

    async def _connect(self, target: Target, deadline: float) -> Connection:
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

    async def _open_connection(self, target: Target) -> Connection:
        secure, host, port = target.origin
        proxy = self._proxies.for_origin(target.origin) if self._proxies is not None else None
        if proxy is not None:
            return await self._through(proxy, target)
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
        context = self._context() if secure else None
        failures: list[tuple[str, OSError]] = []
        for address in addresses:
            try:
                _, connection = await self.loop.create_connection(
                    functools.partial(Connection, self, target.origin),
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

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _through(self, proxy: Proxy, target: Target) -> Connection:
        """A connection through a CONNECT tunnel of the proxy's; TLS to the origin inside it."""
        secure, host, _ = target.origin
        raw = await tunnel(proxy, target.origin)
        transport: asyncio.BaseTransport = raw
        if secure:
            try:
                tls = await self.loop.start_tls(raw, raw.get_protocol(), self._context(), server_hostname=host)
            except (OSError, ssl.SSLError) as exc:
                raw.close()
                raise ConnectFailed(f"cannot connect to {host} through the proxy {proxy.shown}: {exc}", exc) from exc
            if tls is None:
                raise ConnectFailed(f"cannot connect to {host} through the proxy {proxy.shown}: TLS did not start")
            transport = tls
        connection = Connection(self, target.origin)
        transport.set_protocol(connection)
        connection.connection_made(transport)
        return connection

    def release(self, connection: Connection) -> None:
        """An exchange is over: the connection waits in its pool for the next one, or closes."""
        if not connection.reusable or connection.retired or self.closed:
            connection.close()
            return
        connection.idle_since = self.loop.time()
        self._idle.setdefault(connection.origin, []).append(connection)
        if self._waiting:
            self._wake_one()  # a request waiting for a slot takes this connection, or closes it for its own

    def retire(self, connection: Connection) -> None:
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
        oldest: Connection | None = None
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
