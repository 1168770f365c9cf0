"""Request ids: a host's call sent again with the id of one already answered gets that answer
and changes nothing more. The answer is a journal step (Replied) recorded in the same append
as the call's effect, so one commit holds both: it travels with the runtime to whichever
replica runs it next, and survives a restart. A repeat that comes while the first call is
still being served (in this process) waits for it, then reads its answer.

CreateRuntime and DeleteRuntime answer for a runtime that does not exist yet, or no longer:
their answers are kept per tenant by the store (Store.reply), written in the transaction that
creates or deletes the runtime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .journal import Replied


@dataclass(frozen=True)
class RequestKey:
    """A call's request id, and what its request said (the edge's digest of it, the id aside):
    the same id with another request is refused (errors.RequestIdReused)."""

    id: str
    digest: str

    def replied(self, rpc: str, handle_ids: tuple[str, ...] = (), number: int = 0) -> Replied:
        return Replied(self.id, rpc, self.digest, handle_ids, number)

    def matches(self, rpc: str, earlier_rpc: str, earlier_digest: str) -> bool:
        return rpc == earlier_rpc and self.digest == earlier_digest


class OneAtATime:
    """Calls with one request id, served by this process one after the other: a repeat waits
    until the first has its answer recorded (or was refused, recording nothing)."""

    def __init__(self) -> None:
        self._serving: dict[str, _Turns] = {}

    @contextlib.asynccontextmanager
    async def turn(self, request_id: str) -> AsyncIterator[None]:
        turns = self._serving.get(request_id)
        if turns is None:
            turns = self._serving[request_id] = _Turns()
        turns.callers += 1
        try:
            async with turns.lock:
                yield
        finally:
            turns.callers -= 1
            if not turns.callers:
                del self._serving[request_id]


class _Turns:
    __slots__ = ("callers", "lock")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.callers = 0
