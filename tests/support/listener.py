"""A bare TCP listener on loopback that counts the connections it accepts: what an egress test
aims a server at, to tell whether it connected."""

from __future__ import annotations

import asyncio


class Listener:
    """A bare TCP listener that counts the connections it accepts (and answers none)."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        self.accepted = 0
        self.port = port
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Listener:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.close()
