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
from dataclasses import dataclass

from ..journal import Replied


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

    def turn(self, request_id: str) -> _Turn:
        """`async with book.turn(request_id):` the call's turn (a plain class, not a generator's
        context manager: it is on every call a client makes, and costs half as much)."""
        return _Turn(self._serving, request_id)


class _Turns:
    __slots__ = ("callers", "lock")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.callers = 0


class _Turn:
    __slots__ = ("_request_id", "_serving", "_turns")

    def __init__(self, serving: dict[str, _Turns], request_id: str) -> None:
        self._serving = serving
        self._request_id = request_id
        turns = serving.get(request_id)
        if turns is None:
            turns = serving[request_id] = _Turns()
        self._turns = turns

    async def __aenter__(self) -> None:
        self._turns.callers += 1
        try:
            await self._turns.lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._turns.lock.release()
        self._leave()

    def _leave(self) -> None:
        self._turns.callers -= 1
        if not self._turns.callers and self._serving.get(self._request_id) is self._turns:
            del self._serving[self._request_id]
