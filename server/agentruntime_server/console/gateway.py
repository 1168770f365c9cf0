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
INBOX_RUNTIMES = 1000  # runtimes the inbox looks through (the newest)
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


async def pending_requests(client: Client, runtime_id: str, views: Sequence[pb.HandleView]) -> list[Pending]:
    """The runtime's live Requests, once each: a suspended handle's Wait answers at once with
    the Request it (or a child of it) waits on."""
    suspended = [view.handle_id for view in views if view.state == pb.HANDLE_STATE_SUSPENDED]
    results = await asyncio.gather(*(client.wait(runtime_id, handle_id, timeout=1.0) for handle_id in suspended))
    found: dict[str, Pending] = {}
    for result in results:
        if result.status == pb.STATUS_PENDING and result.pending.id and result.pending.id not in found:
            asker = "/".join(result.pending.path) or result.handle_id
            found[result.pending.id] = Pending(runtime_id, asker, result.pending)
    return sorted(found.values(), key=lambda pending: pending.request.id)


async def inbox(client: Client) -> list[Pending]:
    """Every live Request of the tenant's newest runtimes."""
    waiting: list[str] = []
    token = ""
    for _ in range(INBOX_RUNTIMES // 100):
        page = await client.list_runtimes_page(100, token)
        waiting.extend(summary.runtime_id for summary in page.runtimes if summary.suspended_count)
        token = page.next_page_token
        if not token:
            break
    found: list[Pending] = []
    for runtime_id in waiting:
        try:
            found.extend(await pending_requests(client, runtime_id, await handles(client, runtime_id)))
        except AgentRuntimeError as error:
            if not error.is_not_found:  # deleted meanwhile
                raise
    return found


async def settled_result(client: Client, runtime_id: str, view: pb.HandleView) -> pb.TaskResult | None:
    """The handle's last result, unless it is running (or has never run)."""
    if view.state in (pb.HANDLE_STATE_RUNNING, pb.HANDLE_STATE_QUEUED) or view.last_status == pb.STATUS_UNSPECIFIED:
        return None
    return await client.wait(runtime_id, view.handle_id, timeout=1.0)
