"""An MCP server of the test's that answers with as many bytes as it is told: just enough
streamable HTTP (JSON-RPC over POST, no session) for the SDK's client to initialize, list
tools and call one. A listing page is one tool whose description is as long as the page
asks; a call's result is one text of the size asked. Bodies are written in chunks (the
server never holds one), as JSON or as one SSE event, optionally compressed; `sent` counts
what each method got onto the socket before the reader went away."""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from aiohttp import web

from tests.support.loopback import Loopback

CHUNK = 64 * 1024


class HugeMcp(Loopback):
    def __init__(
        self,
        pages: list[int] | None = None,
        result_bytes: int = 2,
        *,
        sse: bool = False,
        encoding: str = "",
        schema: dict[str, Any] | None = None,
        tools_per_page: int = 1,
        output_schema: dict[str, Any] | None = None,
        structured: Any = None,
    ) -> None:
        """`pages`: the description bytes of each listing page's tool (one page of 10 by default);
        `result_bytes`: a call's text; `schema`: the listed tools' input schema; `encoding`: the
        Content-Encoding of every body (gzip and deflate compress it, anything else only says so);
        `output_schema` and `structured`: the tools' listed output schema, and the structured
        content a call answers with beside its text."""
        self.pages = pages or [10]
        self.result_bytes = result_bytes
        self.sse = sse
        self.encoding = encoding
        self.schema = schema or {"type": "object", "properties": {"q": {"type": "string"}}}
        self.tools_per_page = tools_per_page
        self.output_schema = output_schema
        self.structured = structured
        self.sent: Counter[str] = Counter()  # bytes written, by method
        self.cut: Counter[str] = Counter()  # responses whose reader went away before their end
        self.methods: list[str] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/mcp", self._post)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def _post(self, request: web.Request) -> web.StreamResponse:
        message = await request.json()
        method = message.get("method", "")
        self.methods.append(method)
        if "id" not in message:  # a notification
            return web.Response(status=202)
        params = message.get("params") or {}
        if method == "initialize":
            result = {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "huge", "version": "1.0"},
            }
            return await self._answer(request, method, _envelope(message["id"], [json.dumps(result).encode()]))
        if method == "tools/list":
            page = int(params.get("cursor") or 0)
            return await self._answer(request, method, _envelope(message["id"], self._page(page)))
        if method == "tools/call":
            structured = "" if self.structured is None else f',"structuredContent":{json.dumps(self.structured)}'
            text = [
                b'{"content":[{"type":"text","text":"',
                *_filler(self.result_bytes),
                f'"}}]{structured},"isError":false}}'.encode(),
            ]
            return await self._answer(request, method, _envelope(message["id"], text))
        return await self._answer(request, method, _envelope(message["id"], [b"{}"]))

    def _page(self, page: int) -> Iterator[bytes]:
        schema = json.dumps(self.schema)
        yield b'{"tools":['
        for index in range(self.tools_per_page):
            output = "" if self.output_schema is None else f',"outputSchema":{json.dumps(self.output_schema)}'
            yield f'{"," if index else ""}{{"name":"big{page}_{index}","inputSchema":{schema}{output},"description":"'.encode()
            yield from _filler(self.pages[page] // self.tools_per_page)
            yield b'"}'
        more = f',"nextCursor":"{page + 1}"' if page + 1 < len(self.pages) else ""
        yield f"]{more}}}".encode()

    async def _answer(self, request: web.Request, method: str, body: Iterator[bytes]) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream" if self.sse else "application/json"}
        if self.encoding:
            headers["Content-Encoding"] = self.encoding
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        chunks = _sse(body) if self.sse else body
        try:
            async for chunk in _compressed(chunks, self.encoding):
                await response.write(chunk)
                self.sent[method] += len(chunk)
            await response.write_eof()
        except (ConnectionError, RuntimeError):  # the reader went away (aiohttp: a closing transport)
            self.cut[method] += 1
        return response


def _envelope(request_id: Any, result: Iterable[bytes]) -> Iterator[bytes]:
    yield f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":'.encode()
    yield from result
    yield b"}"


def _filler(size: int) -> Iterator[bytes]:
    while size > 0:
        yield b"x" * min(size, CHUNK)
        size -= CHUNK


def _sse(body: Iterator[bytes]) -> Iterator[bytes]:
    # A priming event first (an id, no data): a stream that breaks after it is one the SDK's
    # client resumes, after the `retry` the server asks for (30 s: past any test's patience).
    yield b"id: 0\nretry: 30000\ndata: \n\n"
    yield b"event: message\ndata: "
    yield from body  # one line: the JSON holds no line break
    yield b"\n\n"


async def _compressed(chunks: Iterator[bytes], encoding: str) -> AsyncIterator[bytes]:
    if encoding not in ("gzip", "deflate"):
        for chunk in chunks:
            yield chunk
        return
    encoder = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    for chunk in chunks:
        if out := encoder.compress(chunk):
            yield out
    yield encoder.flush()
