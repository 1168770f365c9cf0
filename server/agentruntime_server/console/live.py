"""A runtime's tree kept live in the browser: Watch (with deltas) folded into the CLI's tree
model here, and what changed sent to the page as server-sent events, a batch per frame."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from agentruntime.cli.view import Tree
from agentruntime.client import AgentRuntimeError, Client
from agentruntime.v1 import agent_runtime_pb2 as pb

from .views import budget_text, cost_text, limit_name, state_name, status_name, tree_order

FRAME = 0.1  # seconds: changes are sent at most this often
SETTLE = 0.05  # seconds without news that end the history's burst (or HISTORY_WAIT at most)
HISTORY_WAIT = 1.0
KEEPALIVE = 15.0  # seconds between comments on a quiet stream (proxies close silent ones)
WRITING_KEPT = 2000  # characters of a running turn's text a row shows (the end of it)
QUEUED = 256  # Watch items read ahead of the page: past it the Watch waits (gRPC's flow control holds the rest)
INSPECTED = 8  # new handles a frame reads the budget of one by one; more: List's pages instead


class LiveTree:
    """The runtime's handles from its events, and what changed since the last frame."""

    def __init__(self, runtime_id: str) -> None:
        self.tree = Tree(runtime_id)
        self.limits: dict[str, int] = {}
        self.budgets: dict[str, str] = {}
        self.own_costs: dict[str, pb.Cost] = {}  # the latest each handle's events reported
        self.writing: dict[str, str] = {}  # the text of each handle's turn in progress
        self.dirty: set[str] = set()
        self.text_dirty: set[str] = set()
        self.requests_changed = False
        self.unknown: set[str] = set()  # spawned, budget not read yet

    def apply(self, item: pb.Event | pb.Delta) -> None:
        if isinstance(item, pb.Delta):
            self._delta(item)
            return
        kind = item.WhichOneof("payload")
        handle_id = item.handle_id
        node = self.tree.nodes.get(handle_id)
        was_suspended = node is not None and node.state == pb.HANDLE_STATE_SUSPENDED
        self.tree.apply(item)
        if kind == "spawned" and node is None:
            self.unknown.add(handle_id)
        elif kind in ("turn_started", "turn_ended") or (
            kind == "state_changed" and item.state_changed.state != pb.HANDLE_STATE_RUNNING
        ):
            self._clear_writing(handle_id)
        if kind == "turn_ended" and item.turn_ended.HasField("own_cost"):
            self.own_costs[handle_id] = item.turn_ended.own_cost
        if kind == "result":
            self.limits[handle_id] = item.result.limit
            if item.result.HasField("own_cost"):
                self.own_costs[handle_id] = item.result.own_cost
            self._clear_writing(handle_id)
        # The Requests change when a handle suspends or goes on: only then does the page read
        # them again (a List and a Wait per waiting handle), not on every turn of a busy runtime.
        if kind == "pending" or (
            kind == "state_changed" and was_suspended != (item.state_changed.state == pb.HANDLE_STATE_SUSPENDED)
        ):
            self.requests_changed = True
        self._touch(handle_id)

    def _delta(self, delta: pb.Delta) -> None:
        piece = delta.WhichOneof("piece")
        if piece == "reset":
            self._clear_writing(delta.handle_id)
        elif piece == "text":
            text = self.writing.get(delta.handle_id, "") + delta.text
            self.writing[delta.handle_id] = text[-WRITING_KEPT:]
            self.text_dirty.add(delta.handle_id)

    def _clear_writing(self, handle_id: str) -> None:
        if self.writing.pop(handle_id, None) is not None:
            self.text_dirty.add(handle_id)

    def _touch(self, handle_id: str) -> None:
        node = self.tree.nodes.get(handle_id)
        while node is not None:  # a handle's figures roll up into its ancestors' totals
            self.dirty.add(node.handle_id)
            node = self.tree.nodes.get(node.parent_id)

    def row(self, handle_id: str) -> dict[str, Any]:
        node = self.tree.nodes[handle_id]
        limit = self.limits.get(handle_id, pb.LIMIT_UNSPECIFIED)
        status = status_name(node.last_status).lower() if node.last_status else ""
        row: dict[str, Any] = {
            "id": handle_id,
            "parent": node.parent_id,
            "agent": node.agent,
            "state": state_name(node.state).lower(),
            "activity": self.tree.activity(node),
            "turns": node.turns,
            "own": node.own_tokens,
            "total": self.tree.total(handle_id),
            "cost": cost_text(self.total_cost(handle_id)),
            "result": " · ".join(part for part in (status, limit_name(limit).lower() if limit else "") if part),
        }
        if handle_id in self.budgets:
            row["budget"] = self.budgets[handle_id]
        return row

    def total_cost(self, handle_id: str) -> pb.Cost:
        """Its own cost and its children's totals (the server's invariant), so that a child's
        turn shows in every ancestor's cost at once, as it does in their tokens."""
        node = self.tree.nodes[handle_id]
        own = self.own_costs.get(handle_id, pb.Cost(priced=True))
        total = pb.Cost(micros=own.micros, currency=own.currency, priced=own.priced)
        for child in node.children:
            part = self.total_cost(child)
            total.micros += part.micros
            total.currency = total.currency or part.currency
            total.priced = total.priced and part.priced and part.currency in ("", total.currency)
        if node.total_cost.micros > total.micros:  # reported by the server: at least as current
            return node.total_cost
        return total

    def snapshot(self) -> list[dict[str, Any]]:
        """Every row and every text being written: what a page that joins the stream late needs."""
        messages: list[dict[str, Any]] = []
        if self.tree.nodes:
            messages.append({"t": "rows", "rows": [self.row(handle_id) for handle_id in sorted(self.tree.nodes, key=tree_order)]})
        messages.extend({"t": "text", "id": handle_id, "text": text} for handle_id, text in sorted(self.writing.items()))
        return messages

    def take(self) -> list[dict[str, Any]]:
        """The messages for the page: changed rows, text written, requests changed."""
        messages: list[dict[str, Any]] = []
        rows = [self.row(handle_id) for handle_id in sorted(self.dirty, key=tree_order) if handle_id in self.tree.nodes]
        if rows:
            messages.append({"t": "rows", "rows": rows})
        for handle_id in sorted(self.text_dirty):
            messages.append({"t": "text", "id": handle_id, "text": self.writing.get(handle_id, "")})
        if self.requests_changed:
            messages.append({"t": "requests"})
        self.dirty.clear()
        self.text_dirty.clear()
        self.requests_changed = False
        return messages


async def relay(client: Client, live: LiveTree, known: set[str]) -> AsyncGenerator[list[dict[str, Any]], None]:
    """Batches of messages for the pages, until the Watch fails: the history's burst folded
    into one batch, then one per frame with news (an empty one: a keepalive); `live` is kept
    current. `known`: the handles the pages have rows for already."""
    runtime_id = live.tree.runtime_id
    queue: asyncio.Queue[pb.Event | pb.Delta | BaseException] = asyncio.Queue(QUEUED)

    async def pump() -> None:
        try:
            async for item in client.watch_with_deltas(runtime_id):
                await queue.put(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the reader, which ends the stream with it
            await queue.put(exc)
            raise

    async def next_item(timeout: float) -> pb.Event | pb.Delta | None:
        # (asyncio.timeout, not wait_for: Python 3.11's wait_for returns the item when a cancel
        # meets one ready, and the cancel is lost: a feed whose last page went read on for ever)
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                item = await queue.get()
        except TimeoutError:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    task = asyncio.create_task(pump())
    loop = asyncio.get_running_loop()
    history = True
    try:
        while True:
            item = await next_item(HISTORY_WAIT if history else KEEPALIVE)
            if item is None:
                history = False
                yield []
                continue
            live.apply(item)
            # The history comes in a burst: it ends when the stream goes quiet. Later news
            # gathers for a frame.
            end = loop.time() + (HISTORY_WAIT if history else FRAME)
            while (left := end - loop.time()) > 0:
                item = await next_item(min(left, SETTLE) if history else left)
                if item is None:
                    if history:
                        break
                    continue
                live.apply(item)
            history = False
            await _read_budgets(client, runtime_id, live, known)
            yield live.take()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def _read_budgets(client: Client, runtime_id: str, live: LiveTree, known: set[str]) -> None:
    """A handle spawned after the page was made gets its row whole: its budget is in no event."""
    fresh = live.unknown - known
    live.unknown.clear()
    if len(fresh) > INSPECTED:  # a burst of spawns: the runtime's List pages (1000 handles each), not an Inspect each
        with contextlib.suppress(AgentRuntimeError):
            async for view in client.iter_handles(runtime_id, page_size=1000):
                if view.handle_id in fresh:
                    live.budgets[view.handle_id] = budget_text(view.budget)
                    live.dirty.add(view.handle_id)
        known.update(fresh)
        return
    for handle_id in sorted(fresh):
        with contextlib.suppress(AgentRuntimeError):
            view = await client.inspect(runtime_id, handle_id)
            live.budgets[handle_id] = budget_text(view.budget)
            live.dirty.add(handle_id)
        known.add(handle_id)


def event_stream_bytes(batch: list[dict[str, Any]]) -> bytes:
    if not batch:
        return f": keepalive {int(time.time())}\n\n".encode()
    return b"".join(b"data: " + json.dumps(message, separators=(",", ":")).encode() + b"\n\n" for message in batch)
