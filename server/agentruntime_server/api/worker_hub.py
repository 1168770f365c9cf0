"""What the edge needs of the hosts serving worker tools: ServeTools connects a host's stream
to its queue, sends it the calls its outbox gives, hands its outputs back, and disconnects it.
tools/workers.py's WorkerPool is it (app.py builds one and hands it to the servicer, and to
the domain as its WorkerToolRunner); the domain never calls these, so they are the edge's
to declare, not a port of the domain's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from ..domain.ports import Dispatch
from ..domain.vocabulary import ToolResult


class WorkerOutbox(Protocol):
    """The calls a worker's stream has yet to send (None: the stream ends)."""

    async def get(self) -> Dispatch | None: ...

    def put_nowait(self, item: Dispatch | None) -> None: ...

    def sending(self, dispatch: Dispatch) -> bool:
        """The stream sends the call it took: False when it was withdrawn meanwhile (never send it)."""
        ...


class WorkerStream(Protocol):
    """One host's stream, connected."""

    @property
    def id(self) -> str: ...

    @property
    def outbox(self) -> WorkerOutbox: ...

    def answer(self, dispatch_id: str, result: ToolResult) -> bool:
        """The worker's output for a call it holds; False when it holds no such call."""
        ...


Stream = TypeVar("Stream", bound=WorkerStream)


class WorkerHub(Protocol[Stream]):
    async def connect(self, tenant: str, queue: str, tools: Sequence[str], limit: int) -> Stream:
        """The host serves the queue of the tenant (`tools`: these only; empty: every tool),
        `limit` calls at once (Unavailable once the server is shutting down)."""
        ...

    async def disconnect(self, worker: Stream) -> None:
        """The host's stream has ended: the calls it holds are in doubt, those never sent are not."""
        ...
