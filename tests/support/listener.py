"""A bare TCP listener on loopback that counts the connections it accepts: what an egress test
aims a server at, to tell whether it connected."""

from __future__ import annotations

import asyncio
import contextlib


class Listener:
    """A bare TCP listener that counts the connections it accepts, and answers none: it reads
    what comes first (a request, or the client's close), then hangs up. A client's request is
    thus always out before the hang-up, and an http tool call to it always in doubt (a hang-up
    that might come before the request or after it would make the outcome a race)."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        self.accepted = 0
        self.port = port
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> Listener:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        for writer in self._open:
            writer.close()
        self._server.close()
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._open.add(writer)
        try:
            with contextlib.suppress(ConnectionError):
                await reader.read(1)
        finally:
            self._open.discard(writer)
            writer.close()
