"""Live pages share their runtime's Watch. The pages of one runtime opened with one token (the
same rights) read one feed: one Watch on the runtime, one tree kept in the console, each batch
encoded once; a page that joins late gets the tree as it stands, at once, not the runtime's
history again. A page holds at most PAGE_BATCHES encoded batches (shared with the other pages);
one that falls behind gets the whole tree instead of what it missed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from agentruntime.client import AgentRuntimeError, Client

from . import live

PAGE_BATCHES = 16
END = b""  # the feed ended: the page's stream ends after what it holds


class Page:
    """One live page's place in a feed: the batches it has yet to send."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(PAGE_BATCHES)

    def put(self, data: bytes) -> None:
        if self.queue.full():  # fallen behind: what it missed is in the tree as it stands
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(self.feed.snapshot())
        self.queue.put_nowait(data)

    async def next(self) -> bytes:
        return await self.queue.get()


class Feed:
    def __init__(self, key: tuple[str, str], client: Client, known: set[str], gone: Callable[[Feed], None]) -> None:
        self.key = key  # (credential, runtime)
        self.tree = live.LiveTree(key[1])
        self.pages: set[Page] = set()
        self.ready = False  # the history's batch went out: a page joining now gets a snapshot
        self._gone = gone
        self.task = asyncio.get_running_loop().create_task(self._run(client, known))

    def join(self) -> Page:
        page = Page(self)
        if self.ready:
            page.put(self.snapshot())
        self.pages.add(page)
        return page

    def leave(self, page: Page) -> None:
        self.pages.discard(page)
        if not self.pages:
            self.task.cancel()  # nobody reads it: its Watch ends
            self._gone(self)

    def snapshot(self) -> bytes:
        return live.event_stream_bytes(self.tree.snapshot())  # (a keepalive, for a tree without handles)

    async def _run(self, client: Client, known: set[str]) -> None:
        try:
            async with contextlib.aclosing(live.relay(client, self.tree, known)) as batches:
                async for batch in batches:
                    self.ready = True
                    self._send(live.event_stream_bytes(batch))
                    if not self.pages:  # (its last page left: it was cancelled too, unless a cancel was lost)
                        return
        except AgentRuntimeError as error:
            self._send(live.event_stream_bytes([{"t": "gone", "message": error.message}]))
        finally:
            self._gone(self)
            self._send(END)

    def _send(self, data: bytes) -> None:
        for page in list(self.pages):
            page.put(data)


class Feeds:
    """The console's feeds, by (credential, runtime)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], Feed] = {}

    async def join(self, credential: str, client: Client, runtime_id: str, listed: Callable[[], Awaitable[set[str]]]) -> Page:
        """A page's place in the runtime's feed, the feed started if there is none (`listed`:
        the runtime's handles now, read with the page's client: NOT_FOUND stops it here)."""
        key = (credential, runtime_id)
        feed = self._by_key.get(key)
        if feed is None:
            known = await listed()
            feed = self._by_key.get(key)  # (started by another page meanwhile)
            if feed is None:
                feed = self._by_key[key] = Feed(key, client, known, self._forget)
        return feed.join()

    def _forget(self, feed: Feed) -> None:
        if self._by_key.get(feed.key) is feed:
            del self._by_key[feed.key]

    def __len__(self) -> int:
        return len(self._by_key)

    def close(self) -> list[asyncio.Task[Any]]:
        tasks = [feed.task for feed in self._by_key.values()]
        for task in tasks:
            task.cancel()
        return tasks
