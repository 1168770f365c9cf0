"""Whether the runtime the console talks to has no authentication (then a person is signed in
without a form: signin.py)."""

from __future__ import annotations

import asyncio
import time

from agentruntime.client import AgentRuntimeError, Client

from .target import Target

OPEN_CHECKED = 5.0  # seconds the answer to "has the runtime no authentication?" is kept


class OpenServer:
    """Whether the runtime has no authentication: a call with no token at all succeeds. Asked
    at most once every OPEN_CHECKED seconds, one call at a time however many ask, and again as
    soon as the runtime refuses an open session's call."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._client: Client | None = None
        self._known: tuple[float, bool] | None = None  # (when, open)
        self._asking: asyncio.Task[bool] | None = None

    async def check(self) -> bool:
        if self._known is not None and time.monotonic() - self._known[0] < OPEN_CHECKED:
            return self._known[1]
        if self._asking is None or self._asking.done():
            self._asking = asyncio.get_running_loop().create_task(self._ask())
        return await asyncio.shield(self._asking)

    def forget(self) -> None:
        self._known = None

    async def _ask(self) -> bool:
        if self._client is None:
            self._client = self.target.client(None, default_token=False, timeout=5.0)
        try:
            await self._client.list_runtimes_page(1)
            found = True
        except AgentRuntimeError:  # UNAUTHENTICATED: it asks for tokens; anything else: the form says it
            found = False
        self._known = (time.monotonic(), found)
        return found

    async def close(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
        if self._client is not None:
            await self._client.close_channel()
