"""A CONNECT proxy on loopback for the length of one test: it opens the tunnels it is asked
for, relays their bytes both ways, and keeps what it saw (each CONNECT's authority and
Proxy-Authorization, and every byte a client sent through it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class ConnectProxy:
    port: int = 0
    tunnels: list[tuple[str, str]] = field(default_factory=list)  # (authority, Proxy-Authorization or "")
    sent: bytearray = field(default_factory=bytearray)  # everything clients sent through the tunnels
    refuse: bool = False  # answer every CONNECT 403, as a proxy whose policy forbids the host
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            method, authority, _ = head.split("\r\n", 1)[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
            self.tunnels.append((authority, headers.get("Proxy-Authorization", "")))
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            if self.refuse:
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            host, port = authority.rsplit(":", 1)
            upstream_reader, upstream_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(
                self._relay(reader, upstream_writer, keep=True), self._relay(upstream_reader, writer, keep=False)
            )
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, keep: bool) -> None:
        try:
            while data := await reader.read(65536):
                if keep:
                    self.sent += data
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def connect_proxy() -> AsyncIterator[ConnectProxy]:
    proxy = ConnectProxy()
    proxy._server = await asyncio.start_server(proxy._serve, "127.0.0.1", 0)
    proxy.port = proxy._server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        proxy._server.close()
