"""One keep-alive connection (an asyncio protocol) and the reply it is reading, parsed by llhttp
(`httptools`). The pool that owns it (`client.HttpClient`) is told when it closes, when an
exchange starts and ends; the connection knows nothing else of the pool."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from .wire import MAX_HEADER_BYTES, MAX_HEADERS, BadReply, BodyLimit, ConnectionLost, HttpError, Origin, ReplyTimeout, Response


class Pool(Protocol):
    """What a connection tells the pool that owns it (`client.HttpClient`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def watch(self, connection: Connection, deadline: float) -> None: ...

    def unwatch(self, connection: Connection) -> None: ...

    def release(self, connection: Connection) -> None: ...

    def retire(self, connection: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection, and the reply it is reading (one at a time)."""

    def __init__(self, client: Pool, origin: Origin) -> None:
        self.client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Response] | None = None
        self.retired = False  # closed (by either side): its pool slot is given back
        self.idle_since = 0.0
        self._reset(0)

    def _reset(self, limit: BodyLimit, sink: Callable[[bytes], None] | None = None) -> None:
        self.limit = limit
        self.sink = sink  # a 2xx body's pieces go here as they come (not kept in `chunks`)
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
        self.client.retire(self)
        if self.waiter is None or self.done:
            return
        if self.headers_done and not self.framed and not self.interim:
            self._finish()  # a body read until the connection closes ends here
        else:
            cause = f" ({exc})" if exc else ""
            self._fail(ConnectionLost(f"the connection closed before the reply was complete{cause}", sent=True))

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
        self.size += len(body)
        streamed = self.sink is not None and 200 <= self.status < 300
        if not streamed:
            self.chunks.append(body)
        if self.size > self.max_body:
            self.truncated = True  # the rest is never read: the connection closes
            self._finish()
        elif streamed:
            self.sink(body)  # type: ignore[misc]

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

    def time_out(self) -> None:
        self._fail(ReplyTimeout())
        self.close()

    async def exchange(
        self, request: bytes, max_body: BodyLimit, deadline: float, sink: Callable[[bytes], None] | None = None
    ) -> Response:
        client = self.client
        transport = self.transport
        assert transport is not None
        # A transport closing already (the server's FIN or RST read, its connection_lost still to
        # come) would drop the request unsent: that is no request the server may have read.
        if self.retired or self.closing:
            raise ConnectionLost("the connection closed before the request was sent", sent=False)
        self._reset(max_body, sink)
        waiter: asyncio.Future[Response] = client.loop.create_future()
        self.waiter = waiter
        transport.write(request)  # from here on the server may read it: a failure leaves it in doubt
        client.watch(self, deadline)
        try:
            return await waiter
        except BaseException:
            self.reusable = False  # cancelled, timed out or failed mid-reply: what it holds is unknown
            raise
        finally:
            client.unwatch(self)
            self.waiter = None
            client.release(self)

    @property
    def closing(self) -> bool:
        """Closed or closing (by either side), whether or not connection_lost has come yet."""
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.client.retire(self)
