"""How much of an MCP server's replies is read: every byte is counted as it comes off the wire,
for the whole session (every response of a listing's pages, of a call, of the stream the SDK
opens for the server's own messages), and the first byte past the session's budget is never
handed up: the connection is closed (its response is dropped unread) and the session is
cancelled at once. The SDK would not stop by itself: it swallows an error while reading an
SSE response and waits for a reply until the timeout, or reconnects. So the budget cancels
the scope the session runs in, and the caller asks the budget why the session ended.

A listing may be LISTING_BYTES on the wire, all pages together. A call may be
`call_bytes(max_text_bytes)`: its text, the one result that reaches the model, is at most
MAX_TEXT_BYTES, and on the wire it is JSON: the SDK's servers send it twice (in `content`
and again in `structuredContent`), and each copy may be up to twice as long escaped (quotes,
backslashes, line breaks; non-ASCII under `ensure_ascii`), so four times the text, and 64 KiB
for the JSON-RPC envelopes and the `initialize` reply. What is read is held at once (the SDK
parses a whole reply): these bounds are the most one session holds, so none parses a reply
long enough to hold the event loop.

Bodies are asked for as `identity`; a gzip or deflate body is decoded anyway, and counted
again decoded (a small body may decode to gigabytes). Any other encoding is refused."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import httpx2

from ..domain.limits import KIB, MIB
from ..domain.ports import McpError

LISTING_BYTES = 4 * MIB
ENVELOPE_BYTES = 64 * KIB


def call_bytes(max_text_bytes: int) -> int:
    """The most a call's session reads from the wire (see the module's text)."""
    return 4 * max_text_bytes + ENVELOPE_BYTES


class BadReply(McpError):
    """A reply the session refused to read on: too long, or in an encoding not asked for."""


class TooLarge(BadReply):
    """The session's replies went past its budget."""


class ReplyBudget:
    """The bytes one session may read. `on_exceeded` is called once, when they run out (the
    session is cancelled there: see `bounded`); `exceeded` says so afterwards. `too_large`: what
    the error says then."""

    def __init__(self, limit: int, too_large: str) -> None:
        self.limit = limit
        self.too_large = too_large
        self.wire = 0
        self.decoded = 0
        self.exceeded = False
        self.on_exceeded: Callable[[], object] | None = None

    def error(self) -> TooLarge:
        return TooLarge(self.too_large)

    def count(self, wire: int, decoded: int = 0) -> None:
        self.wire += wire
        self.decoded += decoded
        if self.wire > self.limit or self.decoded > self.limit:
            self.exceeded = True
            on_exceeded, self.on_exceeded = self.on_exceeded, None
            if on_exceeded is not None:
                on_exceeded()
            raise self.error()

    @property
    def room(self) -> int:
        """Decoded bytes still allowed."""
        return max(self.limit - self.decoded, 0)


@contextlib.contextmanager
def bounded(budget: ReplyBudget) -> Iterator[None]:
    """Runs a session in a scope the budget cancels when it runs out; then (whatever the
    session raised, or if it finished) the budget's error is raised."""
    try:
        with anyio.CancelScope() as scope:
            budget.on_exceeded = scope.cancel
            yield
    except Exception:
        if budget.exceeded:
            raise budget.error() from None
        raise
    finally:
        budget.on_exceeded = None
    if budget.exceeded:
        raise budget.error()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport whose responses are read under a budget."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, budget: ReplyBudget) -> None:
        self._inner = inner
        self._budget = budget

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
            await response.aclose()
            raise BadReply(f"it answered in content encoding {encoding[:32]!r}, which was not asked for")
        headers = response.headers
        decoded = encoding not in ("identity", "")
        if decoded:  # decoded here, bounded: httpx2 would decode it whole
            headers = httpx2.Headers([(k, v) for k, v in headers.multi_items() if k.lower() not in _FRAMING])
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        stream = _BoundedStream(response.stream, self._budget, encoding if decoded else None)
        return httpx2.Response(response.status_code, headers=headers, stream=stream, extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


_FRAMING = frozenset({"content-encoding", "content-length"})


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, budget: ReplyBudget, encoding: str | None) -> None:
        self._inner = inner
        self._budget = budget
        self._encoding = encoding
        self._decoder: zlib._Decompress | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            try:
                self._budget.count(len(chunk))
                if self._encoding is not None:
                    chunk = self._decode(chunk)
                    self._budget.count(0, len(chunk))
            except McpError:
                await self._inner.aclose()  # unread: the connection closes, it is not reused
                raise
            yield chunk

    def _decode(self, chunk: bytes) -> bytes:
        if self._decoder is None:
            if self._encoding == "deflate":
                # zlib's format by the RFC, raw deflate from some servers: the header tells.
                wrapped = len(chunk) >= 2 and chunk[0] & 0x0F == 8 and (chunk[0] << 8 | chunk[1]) % 31 == 0
                self._decoder = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            else:
                self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            # At most one byte past the budget: enough to know it is over.
            return self._decoder.decompress(chunk, self._budget.room + 1)
        except zlib.error as error:
            raise BadReply(f"its {self._encoding} body does not decode ({error})") from None

    async def aclose(self) -> None:
        await self._inner.aclose()
