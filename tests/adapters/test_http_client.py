"""The HTTP/1.1 client of model calls and http tools (server/agentruntime_server/http/),
against real loopback servers: a raw asyncio server that answers each request with the
bytes a test scripts (framing, encodings, faults), and aiohttp for TLS and compression."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme
from agentruntime_server.http import BadReply, BodyLimit, ConnectFailed, ConnectionLost, HttpClient, ReplyTimeout, Response
from aiohttp import web

from tests.support.poll import until

Answer = Callable[[bytes], bytes | None]  # a request's head and body -> the bytes to send (None: nothing)

VERSION = (Path(__file__).resolve().parents[2] / "VERSION").read_text().strip()


@dataclass
class RawServer:
    """Reads each request (head and Content-Length body) on every connection, records it,
    and writes what `answer` returns; `close_after` closes the connection after a reply."""

    answer: Answer
    close_after: bool = False
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    requests: list[bytes] = field(default_factory=list)
    eofs: int = 0
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.eofs += 1
                    return
                length = next(
                    (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
                    0,
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                reply = self.answer(request)
                if reply is None:  # a server that never answers: it waits for the client to go
                    if not await reader.read(1):
                        self.eofs += 1
                    return
                writer.write(reply)
                await writer.drain()
                if self.close_after:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            self.eofs += 1
        finally:
            self.open_now -= 1
            writer.close()


@asynccontextmanager
async def raw_server(answer: Answer, close_after: bool = False) -> AsyncIterator[RawServer]:
    served = RawServer(answer, close_after)
    server = await asyncio.start_server(served.handle, "127.0.0.1", 0)
    served.port = server.sockets[0].getsockname()[1]
    try:
        yield served
    finally:
        server.close()


def ok(body: bytes = b"hello", *extra: str) -> bytes:
    headers = "".join(f"{line}\r\n" for line in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), headers.encode(), body)


async def post(
    client: HttpClient, port: int, body: bytes = b"{}", path: str = "/x", *, timeout: float = 5.0, max_body: BodyLimit = 1 << 20
) -> Response:
    return await client.post(
        f"http://127.0.0.1:{port}{path}", body, {"Content-Type": "application/json"}, timeout=timeout, max_body=max_body
    )


# ---- the exchange ------------------------------------------------------------------------


async def test_a_request_goes_out_as_http_1_1_with_its_length_and_headers() -> None:
    async with raw_server(lambda _: ok()) as server:
        client = HttpClient()
        response = await client.post(
            f"http://127.0.0.1:{server.port}/v1/chat/completions?x=1&y=é",
            b'{"a": 1}',
            {"Authorization": "Bearer k", "Idempotency-Key": "rt/root/call_1_1"},
            timeout=5,
            max_body=100,
        )
        await client.close()
    assert (response.status, response.body, response.truncated) == (200, b"hello", False)
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions?x=1&y=%C3%A9 HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}" in lines
    assert "Content-Length: 8" in lines and body == b'{"a": 1}'
    assert "Authorization: Bearer k" in lines and "Idempotency-Key: rt/root/call_1_1" in lines
    # The one release version: the installed server's, so a stale install shows here too.
    assert "Accept-Encoding: identity" in lines and f"User-Agent: agentruntime/{VERSION}" in lines


async def test_an_ipv6_literal_is_connected_to_and_named_in_brackets() -> None:
    served = RawServer(lambda _: ok())
    server = await asyncio.start_server(served.handle, "::1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = HttpClient()
        assert (await client.post(f"http://[::1]:{port}/v6", b"", {}, timeout=5, max_body=10)).body == b"hello"
        await client.close()
    finally:
        server.close()
    assert f"Host: [::1]:{port}\r\n".encode() in served.requests[0]


async def test_a_connection_is_kept_alive_and_reused() -> None:
    async with raw_server(lambda _: ok()) as server:
        client = HttpClient()
        for _ in range(5):
            await post(client, server.port)
        await client.close()
    assert len(server.requests) == 5 and server.connections == 1


async def test_connection_close_and_http_1_0_replies_are_not_reused() -> None:
    async with raw_server(lambda _: ok(b"x", "Connection: close")) as server:
        client = HttpClient()
        for _ in range(3):
            await post(client, server.port)
        assert server.connections == 3
        await client.close()
    reply = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi"
    async with raw_server(lambda _: reply) as server:
        client = HttpClient()
        for _ in range(2):
            assert (await post(client, server.port)).body == b"hi"
        assert server.connections == 2
        await client.close()


async def test_chunked_and_read_until_close_bodies() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    async with raw_server(lambda _: chunked) as server:
        client = HttpClient()
        assert (await post(client, server.port)).body == b"hello world"
        assert (await post(client, server.port)).body == b"hello world"
        assert server.connections == 1
        await client.close()
    unframed = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it until the end"
    async with raw_server(lambda _: unframed, close_after=True) as server:
        client = HttpClient()
        response = await post(client, server.port)
        assert response.body == b"all of it until the end"
        await client.close()


async def test_interim_replies_are_skipped() -> None:
    reply = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + ok(b"final", "X-Final: 1")
    async with raw_server(lambda _: reply) as server:
        client = HttpClient()
        response = await post(client, server.port)
        assert (response.status, response.body, response.headers.get("x-final"), "link" in response.headers) == (
            200,
            b"final",
            "1",
            False,
        )
        await post(client, server.port)
        assert server.connections == 1
        await client.close()


async def test_headers_are_lower_cased_repeated_ones_joined_and_charset_read() -> None:
    reply = ok(b"{}", "Content-Type: text/plain; charset=ISO-8859-1", "X-Many: a", "x-many: b", "Retry-After: 3")
    async with raw_server(lambda _: reply) as server:
        client = HttpClient()
        response = await post(client, server.port)
        await client.close()
    assert response.headers["x-many"] == "a, b" and response.headers["retry-after"] == "3"
    assert response.charset == "ISO-8859-1"


# ---- bounds ------------------------------------------------------------------------------


async def test_a_body_over_the_limit_is_cut_not_read_and_its_connection_closed() -> None:
    big = b"x" * 100_000
    async with raw_server(lambda _: ok(big)) as server:
        client = HttpClient()
        response = await post(client, server.port, max_body=1000)
        assert (len(response.body), response.truncated) == (1000, True)
        exact = await post(client, server.port, max_body=100_000)
        assert (len(exact.body), exact.truncated) == (100_000, False)
        assert server.connections == 2  # the cut one was not reused
        await client.close()


async def test_a_body_limit_may_depend_on_the_status() -> None:
    big = b"y" * 50_000
    replies = iter([ok(big), b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)])
    async with raw_server(lambda _: next(replies)) as server:
        client = HttpClient()

        def limit(status: int) -> int:
            return 60_000 if status < 300 else 100

        whole = await post(client, server.port, max_body=limit)
        assert (len(whole.body), whole.truncated) == (50_000, False)
        error = await post(client, server.port, max_body=limit)
        assert (error.status, error.body, error.truncated) == (500, b"y" * 100, True)
        await client.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
async def test_compressed_bodies_are_decoded_and_bounded_when_decoded(encoding: str) -> None:
    text = b"the same line again\n" * 5000  # 100 KB, compressing to a few hundred bytes
    if encoding == "gzip":
        packed = gzip.compress(text)
    elif encoding == "deflate":
        packed = zlib.compress(text)
    else:
        squeezer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = squeezer.compress(text) + squeezer.flush()
    name = "gzip" if encoding == "gzip" else "deflate"
    async with raw_server(lambda _: ok(packed, f"Content-Encoding: {name}")) as server:
        client = HttpClient()
        whole = await post(client, server.port)
        assert (whole.body, whole.truncated) == (text, False)
        bomb = await post(client, server.port, max_body=4096)  # small on the wire, over the limit decoded
        assert (bomb.body, bomb.truncated) == (text[:4096], True)
        await client.close()


async def test_a_reply_that_is_not_http_or_too_big_in_its_headers_is_a_bad_reply() -> None:
    async with raw_server(lambda _: b"SSH-2.0-OpenSSH_9.6\r\n\r\n") as server:
        client = HttpClient()
        with pytest.raises(BadReply, match="not HTTP"):
            await post(client, server.port)
        await client.close()
    flood = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(100)) + b"\r\n"
    async with raw_server(lambda _: flood) as server:
        client = HttpClient()
        with pytest.raises(BadReply, match="headers exceed"):
            await post(client, server.port)
        await client.close()


async def test_a_server_that_says_more_than_one_reply_loses_its_connection() -> None:
    async with raw_server(lambda _: ok(b"one") + ok(b"two")) as server:
        client = HttpClient()
        assert (await post(client, server.port)).body == b"one"
        assert (await post(client, server.port)).body == b"one"
        assert server.connections == 2
        await client.close()


def test_a_header_that_cannot_go_on_the_wire_is_refused_without_its_value() -> None:
    client = HttpClient()
    with pytest.raises(ValueError) as refused:
        asyncio.run(client.post("http://127.0.0.1:9/", b"", {"X-Key": "s3cret\r\nX-Evil: 1"}, timeout=1, max_body=1))
    assert "X-Key" in str(refused.value) and "s3cret" not in str(refused.value)
    with pytest.raises(ValueError, match="not an HTTP token"):
        asyncio.run(client.post("http://127.0.0.1:9/", b"", {"Bad Name": "v"}, timeout=1, max_body=1))
    with pytest.raises(ValueError, match="scheme"):
        asyncio.run(client.post("ftp://127.0.0.1/", b"", {}, timeout=1, max_body=1))


# ---- faults and deadlines ----------------------------------------------------------------


async def test_nothing_listening_and_a_name_that_does_not_resolve_fail_to_connect() -> None:
    client = HttpClient()
    with pytest.raises(ConnectFailed) as refused:
        await post(client, 9)
    assert isinstance(refused.value.os_error, ConnectionRefusedError)
    with pytest.raises(ConnectFailed, match="cannot resolve") as unresolved:
        await client.post("http://no-such-host.invalid/", b"", {}, timeout=5, max_body=1)
    assert isinstance(unresolved.value.os_error, OSError)
    await client.close()


async def test_a_deadline_covers_the_whole_exchange_and_closes_the_connection() -> None:
    async with raw_server(lambda request: None if b"slow" in request else ok()) as server:
        client = HttpClient()
        started = asyncio.get_running_loop().time()
        with pytest.raises(ReplyTimeout):  # the request went out: the server may have acted on it
            await post(client, server.port, body=b"slow", timeout=0.2)
        assert asyncio.get_running_loop().time() - started < 2
        await until(lambda: server.eofs == 1, "the server to see the client go", timeout=5)
        assert server.eofs == 1  # the server saw the client go
        assert (await post(client, server.port)).status == 200
        assert server.connections == 2 and client.connections == 1
        await client.close()


async def test_each_exchange_times_out_at_its_own_deadline() -> None:
    """One timer watches every exchange: a later deadline set first, an earlier one after it,
    each fails at its own time, and one that answers in time is not touched."""
    async with raw_server(lambda request: None if b"slow" in request else ok()) as server:
        client = HttpClient()
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def timed(timeout: float) -> float:
            with pytest.raises(TimeoutError):
                await post(client, server.port, body=b"slow", timeout=timeout)
            return loop.time() - started

        late = asyncio.ensure_future(timed(0.6))
        await asyncio.sleep(0.05)
        early = asyncio.ensure_future(timed(0.2))
        assert (await post(client, server.port, timeout=0.3)).status == 200
        # (uvloop's timers count whole milliseconds: one may fire a hair before its time)
        assert 0.199 <= await early < 0.5
        assert 0.599 <= await late < 1.0
        await client.close()


async def test_a_cancelled_exchange_closes_its_connection_and_frees_its_slot() -> None:
    async with raw_server(lambda request: None if b"slow" in request else ok()) as server:
        client = HttpClient(pool_size=1)
        call = asyncio.ensure_future(post(client, server.port, body=b"slow"))
        await until(lambda: len(server.requests) == 1, "the request to reach the server", timeout=5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await until(lambda: server.eofs == 1, "the server to see the client go", timeout=5)
        assert server.eofs == 1 and client.connections == 0
        assert (await post(client, server.port)).status == 200
        await client.close()


async def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    async with raw_server(lambda _: ok(), close_after=False) as server:
        client = HttpClient()
        await post(client, server.port)
        server.close_after = True  # the next reply, then the server hangs up
        await post(client, server.port)
        await until(lambda: client.connections == 0, "the close to reach the client while its connection is idle", timeout=5)
        assert (await post(client, server.port)).status == 200
        assert server.connections == 2
        await client.close()


async def test_a_reply_cut_short_is_a_lost_connection() -> None:
    async with raw_server(lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", close_after=True) as server:
        client = HttpClient()
        with pytest.raises(ConnectionLost) as lost:
            await post(client, server.port)
        assert lost.value.sent
        await client.close()


async def test_a_server_hanging_up_after_reading_the_request_loses_a_sent_request() -> None:
    """What an http tool's in-doubt rule reads: the request was written, so the server may have
    acted on it (tools/http.py)."""
    async with raw_server(lambda _: b"", close_after=True) as server:
        client = HttpClient()
        with pytest.raises(ConnectionLost) as lost:
            await post(client, server.port, body=b'{"cents": 500}')
        assert lost.value.sent and server.requests[0].endswith(b'{"cents": 500}')
        await client.close()


async def test_a_request_never_written_is_lost_unsent() -> None:
    async with raw_server(lambda _: ok()) as server:
        client = HttpClient()
        await client.close()
        with pytest.raises(ConnectionLost) as lost:
            await post(client, server.port)
        assert not lost.value.sent and server.requests == []


async def test_keep_alive_connections_are_dropped_after_the_idle_time() -> None:
    async with raw_server(lambda _: ok()) as server:
        client = HttpClient(keepalive=0.05)
        await post(client, server.port)
        await asyncio.sleep(0.1)
        await post(client, server.port)
        assert server.connections == 2
        await client.close()


async def test_the_pool_size_caps_connections_and_the_rest_wait_their_turn() -> None:
    def answer(request: bytes) -> bytes:
        return ok(request.rpartition(b"\r\n\r\n")[2])

    gate = asyncio.Event()

    async with raw_server(answer) as server:
        client = HttpClient(pool_size=2)
        original = server.handle

        async def slow_handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await gate.wait()
            await original(reader, writer)

        server.handle = slow_handle  # type: ignore[method-assign]
        calls = [asyncio.ensure_future(post(client, server.port, body=b"%d" % i)) for i in range(6)]
        await until(lambda: client.connections == 2, "two connections to open", timeout=5)
        assert client.connections == 2
        gate.set()
        bodies = [response.body for response in await asyncio.gather(*calls)]
        assert bodies == [b"%d" % i for i in range(6)]
        assert server.connections == 2 and server.most_open <= 2
        await client.close()


async def test_a_waiter_whose_deadline_passes_gives_up_without_a_connection() -> None:
    async with raw_server(lambda request: None) as server:
        client = HttpClient(pool_size=1)
        first = asyncio.ensure_future(post(client, server.port, timeout=1.0))
        await until(lambda: len(server.requests) == 1, "the first request to hold the one connection", timeout=5)
        with pytest.raises(TimeoutError) as waited:
            await post(client, server.port, timeout=0.1)
        assert not isinstance(waited.value, ReplyTimeout)  # it never had a connection: nothing was sent
        with pytest.raises(ReplyTimeout):
            await first
        await client.close()


# ---- TLS ---------------------------------------------------------------------------------


@asynccontextmanager
async def tls_server(ca: trustme.CA) -> AsyncIterator[int]:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"secure {await request.text()}")

    app = web.Application()
    app.router.add_post("/", hello)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def test_https_verifies_the_server_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = trustme.CA()
    async with tls_server(ca) as port:
        trusting = ssl.create_default_context()
        ca.configure_trust(trusting)
        client = HttpClient(ssl_context=trusting)
        response = await client.post(f"https://localhost:{port}/", b"hi", {}, timeout=5, max_body=100)
        assert (response.status, response.body) == (200, b"secure hi")
        await client.close()
        stranger = HttpClient()  # the system's roots: they do not know the test's CA
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await stranger.post(f"https://localhost:{port}/", b"hi", {}, timeout=5, max_body=100)
        await stranger.close()
        bundle = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        monkeypatch.setenv("SSL_CERT_FILE", str(bundle))  # a server's private CA, as its README says
        configured = HttpClient()
        response = await configured.post(f"https://localhost:{port}/", b"env", {}, timeout=5, max_body=100)
        assert (response.status, response.body) == (200, b"secure env")
        await configured.close()


async def test_an_aiohttp_server_compressing_anyway_is_read() -> None:
    async def packed(request: web.Request) -> web.Response:
        response = web.Response(text="z" * 5000)
        response.enable_compression(force=web.ContentCoding.gzip)
        return response

    app = web.Application()
    app.router.add_post("/", packed)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        client = HttpClient()
        response = await client.post(f"http://127.0.0.1:{port}/", b"", {}, timeout=5, max_body=10_000)
        assert (response.body, response.headers.get("content-encoding")) == (b"z" * 5000, "gzip")
        await client.close()
    finally:
        await runner.cleanup()
