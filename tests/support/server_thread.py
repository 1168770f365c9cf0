"""The real server on an event loop of its own thread, so that test bodies (hypothesis rules
and strategies) stay synchronous."""

from __future__ import annotations

import asyncio
import threading
from contextlib import AsyncExitStack
from typing import Any

from agentruntime_server.process.event_loop import DEFAULT_LOOP, loop_factory

from tests.support.servers import Served, serve


class ServerThread:
    def __init__(self, name: str, **overrides: Any) -> None:
        self.overrides = overrides
        self.loop = loop_factory(DEFAULT_LOOP)()  # the loop a server runs on by default
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.serving = AsyncExitStack()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def start(self) -> int:
        self.thread.start()
        served: Served = self.run(self.serving.enter_async_context(serve(**self.overrides)))
        return served.port

    def stop(self) -> None:
        self.run(self.serving.aclose())
        self.run(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


async def _cancel_the_rest() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
