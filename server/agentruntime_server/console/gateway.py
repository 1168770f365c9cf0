"""What the pages read and do, through the public gRPC API only (the Python client, with the
signed-in person's credentials)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from agentruntime.client import AgentRuntimeError, Client
from agentruntime.v1 import agent_runtime_pb2 as pb

RUNTIMES_PER_PAGE = 50
SCANNED_PER_PAGE = 10  # server pages (of 100) a filtered runtimes page reads at most
TRANSCRIPT_PAGE = 50
INBOX_WAITS = 50  # Waits an inbox page makes at most (a Request each): whole runtimes, newest first
INBOX_SCANNED = 10  # pages of 100 runtimes an inbox page reads at most to find them
PAGE_WAITS = 100  # Waits a runtime's page makes at most
STATUSES = ("running", "waiting", "idle")


def runtime_status(summary: pb.RuntimeSummary) -> str:
    """running: a handle has a run in flight; waiting: a handle waits for its host; idle: neither."""
    if summary.running_count:
        return "running"
    if summary.suspended_count:
        return "waiting"
    return "idle"


def _matches(summary: pb.RuntimeSummary, text: str, status: str) -> bool:
    if text and text.lower() not in summary.runtime_id.lower():
        return False
    if status == "waiting":
        return summary.suspended_count > 0
    return not status or runtime_status(summary) == status


async def runtimes_page(client: Client, text: str, status: str, page_token: str) -> tuple[list[pb.RuntimeSummary], str]:
    """A page of the tenant's runtimes, newest first, those whose id holds `text` and whose
    status is `status` (either may be empty); the token continues where it stopped."""
    if not text and not status:
        page = await client.list_runtimes_page(RUNTIMES_PER_PAGE, page_token)
        return list(page.runtimes), page.next_page_token
    found: list[pb.RuntimeSummary] = []
    token = page_token
    for _ in range(SCANNED_PER_PAGE):
        page = await client.list_runtimes_page(100, token)
        found.extend(summary for summary in page.runtimes if _matches(summary, text, status))
        token = page.next_page_token
        if not token or len(found) >= RUNTIMES_PER_PAGE:
            break
    return found, token


async def handles(client: Client, runtime_id: str) -> list[pb.HandleView]:
    return [view async for view in client.iter_handles(runtime_id, page_size=1000)]


@dataclass(frozen=True)
class Pending:
    runtime_id: str
    handle_id: str  # the handle that asked (the last of `request.path`)
    request: pb.Request


async def pending_requests(
    client: Client, runtime_id: str, views: Sequence[pb.HandleView], limit: int = PAGE_WAITS
) -> tuple[list[Pending], int]:
    """The runtime's live Requests, once each, from at most `limit` Waits, and how many suspended
    handles were left unasked. A suspended handle's Wait answers at once with the Request it (or
    a child of it) waits on: those whose children wait on nothing are asked first."""
    suspended = [view for view in views if view.state == pb.HANDLE_STATE_SUSPENDED]
    presenting = {view.parent_id for view in suspended}  # (a parent presents a child's Request)
    suspended.sort(key=lambda view: view.handle_id in presenting)
    asked = [view.handle_id for view in suspended[: max(limit, 0)]]
    results = await asyncio.gather(*(client.wait(runtime_id, handle_id, timeout=1.0) for handle_id in asked))
    found: dict[str, Pending] = {}
    for result in results:
        if result.status == pb.STATUS_PENDING and result.pending.id and result.pending.id not in found:
            asker = "/".join(result.pending.path) or result.handle_id
            found[result.pending.id] = Pending(runtime_id, asker, result.pending)
    return sorted(found.values(), key=lambda pending: pending.request.id), len(suspended) - len(asked)


@dataclass(frozen=True)
class InboxPage:
    pending: list[Pending]
    unread: list[tuple[str, int]]  # (runtime, its waiting handles this page did not ask: past the cap)
    next_page: tuple[str, int] | None  # where the next inbox page starts: a ListRuntimes page token, runtimes to skip in it


async def inbox(client: Client, page_token: str = "", skip: int = 0) -> InboxPage:
    """A page of the live Requests of the tenant's runtimes, newest runtimes first: whole
    runtimes while their waiting handles (ListRuntimes counts them) fit in INBOX_WAITS, so a
    page makes at most INBOX_SCANNED ListRuntimes, a List per runtime and INBOX_WAITS Waits."""
    chosen: list[tuple[str, int]] = []  # (runtime, Waits it may make)
    left = INBOX_WAITS
    token = page_token
    next_page: tuple[str, int] | None = None
    for _ in range(INBOX_SCANNED):
        page = await client.list_runtimes_page(100, token)
        summaries = list(page.runtimes)
        for index in range(skip, len(summaries)):
            waiting = summaries[index].suspended_count
            if not waiting:
                continue
            if left <= 0 or (chosen and waiting > left):
                next_page = (token, index)
                break
            chosen.append((summaries[index].runtime_id, min(waiting, left)))
            left -= min(waiting, left)
        if next_page is not None or not page.next_page_token:
            break
        token, skip = page.next_page_token, 0
    else:
        next_page = (token, 0)  # looked through INBOX_SCANNED pages: the next inbox page goes on

    async def read(runtime_id: str, limit: int) -> tuple[list[Pending], int]:
        try:
            return await pending_requests(client, runtime_id, await handles(client, runtime_id), limit)
        except AgentRuntimeError as error:
            if error.is_not_found:  # deleted meanwhile
                return [], 0
            raise

    results = await asyncio.gather(*(read(runtime_id, limit) for runtime_id, limit in chosen))
    found = [item for requests, _ in results for item in requests]
    unread = [(runtime_id, missed) for (runtime_id, _), (_, missed) in zip(chosen, results, strict=True) if missed]
    return InboxPage(found, unread, next_page)


async def settled_result(client: Client, runtime_id: str, view: pb.HandleView) -> pb.TaskResult | None:
    """The handle's last result, unless it is running (or has never run)."""
    if view.state in (pb.HANDLE_STATE_RUNNING, pb.HANDLE_STATE_QUEUED) or view.last_status == pb.STATUS_UNSPECIFIED:
        return None
    return await client.wait(runtime_id, view.handle_id, timeout=1.0)
