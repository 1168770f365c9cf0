"""Server-sent events from the scripted model servers: the SDKs' own stream event types,
serialized as the APIs send them, with pauses between them, and a stream cut short on demand."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web


@dataclass
class Streamed:
    """How a scripted reply streams: its text in pieces of `chunk` characters (0: whole), `pause`
    seconds before each event after the first, and the connection cut after `cut_after` events
    (None: never)."""

    chunk: int = 0
    pause: float = 0.0
    cut_after: int | None = None
    finished: bool = False  # set once its last event was written


def pieces(text: str, chunk: int) -> list[str]:
    size = chunk or len(text) or 1
    return [text[start : start + size] for start in range(0, len(text), size)]


async def send(request: web.Request, events: list[tuple[str | None, str]], streamed: Streamed) -> web.StreamResponse:
    """`events`: (event name or None, data) pairs, each written as it is due."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for number, (name, data) in enumerate(events):
        if streamed.cut_after is not None and number >= streamed.cut_after:
            assert request.transport is not None
            request.transport.close()  # mid-stream: no terminating chunk
            return response
        if number and streamed.pause:
            await asyncio.sleep(streamed.pause)
        head = f"event: {name}\n" if name else ""
        await response.write(f"{head}data: {data}\n\n".encode())
    await response.write_eof()
    streamed.finished = True
    return response
