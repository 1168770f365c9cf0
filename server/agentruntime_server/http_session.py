"""The keep-alive HTTP client session the model providers share (http tools have their
own, under the egress policy: tools/http.py).

aiohttp, not httpx's default transport: on the model-call path httpcore's pool costs
more CPU per request as connections grow (see the closing notes and `make bench`)."""

from __future__ import annotations

import aiohttp


class HttpSession:
    """Created lazily inside the running event loop; sized to the concurrency we serve."""

    def __init__(self, pool_size: int, max_reply_bytes: int = 1 << 20) -> None:
        self._pool_size = pool_size
        self.max_reply_bytes = max_reply_bytes  # a larger reply body is not read: a provider fault
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, raise_for_status=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


_CHUNK = 64 * 1024


async def read_at_most(response: aiohttp.ClientResponse, size: int) -> bytes:
    """The body's first `size` bytes (fewer if it is shorter); the rest is never read."""
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = await response.content.read(min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
