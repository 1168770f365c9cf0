"""What one tick appended to the PostgreSQL store (store/postgres/), by every runtime,
and the commit that writes it."""

from __future__ import annotations

import asyncio

from ...domain.journal.tree import RuntimeCounts
from ..payloads import Row


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a failed commit nobody flushed is not "never retrieved"


class Batch:
    """What one tick appended, by every runtime, and the commit that writes it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.rows: list[Row] = []
        self.running: dict[str, bool] = {}
        self.counts: dict[str, RuntimeCounts] = {}
        self.touched: set[str] = set()  # runtimes written: their updated_at moves
        self.grown: dict[str, int] = {}  # runtime -> the payload bytes appended
        self.tokens: dict[tuple[str, int], tuple[int, int]] = {}  # (tenant, minute) -> (tokens, micros)
        self.epochs: dict[str, int] = {}  # replicas: the epoch each runtime's rows were appended under
        self.done: asyncio.Future[None] = loop.create_future()
        self.done.add_done_callback(_retrieved)

    def forget(self, runtime_id: str) -> None:
        self.rows = [row for row in self.rows if row[0] != runtime_id]
        for table in (self.running, self.counts, self.epochs, self.grown):
            table.pop(runtime_id, None)
        self.touched.discard(runtime_id)
