"""The one keep-alive HTTP client session shared by the model providers and the http tools.

aiohttp, not httpx's default transport: on the model-call path httpcore's pool costs
more CPU per request as connections grow (see the closing notes and `make bench`)."""

from __future__ import annotations

import aiohttp


class HttpSession:
    """Created lazily inside the running event loop; sized to the concurrency we serve."""

    def __init__(self, pool_size: int) -> None:
        self._pool_size = pool_size
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
