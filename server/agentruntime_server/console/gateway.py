"""What the pages read and do, through the public gRPC API only (the Python client, with the
signed-in person's credentials)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentruntime.client import AgentRuntimeError, Client
from agentruntime.v1 import agent_runtime_pb2 as pb

RUNTIMES_PER_PAGE = 50
SCANNED_PER_PAGE = 10  # server pages (of 100) a filtered runtimes page reads at most
TRANSCRIPT_PAGE = 50
INBOX_WAITS = 50  # Waits an inbox page makes at most (a Request each): whole runtimes, newest first
INBOX_SCANNED = 10  # pages of 100 runtimes an inbox page reads at most to find them
PAGE_WAITS = 100  # Waits a runtime's page makes at most
# A transcript page reads the runtime's Watch history for its messages' seqs (a fork's cut): it
# stops once it has them all; else, as the live feeds do, when the stream goes quiet (the history
# is sent, what follows is live), after HISTORY_WAIT for the first event and HISTORY_QUIET for
# the next, or after HISTORY_AT_MOST in all (a busy runtime's stream is never quiet). A handle
# with messages has events, and its first page of history comes whole: the first wait is the
# whole bound, so that a slow server leaves no button out of a page it can place.
HISTORY_WAIT = 5.0
HISTORY_QUIET = 0.25
HISTORY_AT_MOST = 5.0
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


@dataclass
class HandleHistory:
    """What one handle's events say about its transcript: the seq of the event of the step that
    recorded each reply (`turn_ended`, by turn) and each tool result (`tool_call_ended`, by call
    id), and of each `state_changed` RUNNING (a run started, or went on)."""

    replies: dict[int, int] = field(default_factory=dict)
    results: dict[str, int] = field(default_factory=dict)
    runs: list[int] = field(default_factory=list)
    last_turn: int = 0  # the highest turn whose reply was seen

    def add(self, event: pb.Event) -> None:
        kind = event.WhichOneof("payload")
        if kind == "turn_ended":
            self.replies.setdefault(event.turn_ended.turn, event.seq)
            self.last_turn = max(self.last_turn, event.turn_ended.turn)
        elif kind == "tool_call_ended":
            self.results.setdefault(event.tool_call_ended.call_id, event.seq)
        elif kind == "state_changed" and event.state_changed.state == pb.HANDLE_STATE_RUNNING:
            self.runs.append(event.seq)


async def handle_history(client: Client, runtime_id: str, handle_id: str, messages: Sequence[pb.Message]) -> HandleHistory:
    """The handle's events from the runtime's Watch history, read until every reply and tool
    result of `messages` has its event (or a reply after them shows the rest never will), or the
    stream goes quiet (HISTORY_WAIT, HISTORY_QUIET, HISTORY_AT_MOST). Events come in seq order, so
    whatever was read is the whole history up to the last event read."""
    turns = {message.turn for message in messages if message.role == "assistant"}
    calls = {message.tool_call_id for message in messages if message.role == "tool" and message.tool_call_id}
    after = max(turns, default=0) + 1  # a reply past the page's: every result of the page's calls came before it
    history = HandleHistory()
    loop = asyncio.get_running_loop()
    end = loop.time() + HISTORY_AT_MOST
    wait = HISTORY_WAIT
    events = client.watch(runtime_id)
    try:
        while True:
            try:
                async with asyncio.timeout(max(min(wait, end - loop.time()), 0.0)):
                    event = await anext(events)
            except (TimeoutError, StopAsyncIteration):
                return history
            wait = HISTORY_QUIET
            if event.handle_id != handle_id:
                continue
            history.add(event)
            if (turns <= history.replies.keys() and calls <= history.results.keys()) or after in history.replies:
                return history
    finally:
        closing = getattr(events, "aclose", None)  # (an async generator: its Watch ends now)
        if closing is not None:
            await closing()


def message_seqs(messages: Sequence[pb.Message], history: HandleHistory, first_page: bool) -> list[int | None]:
    """For each message of a transcript page, the seq of the event to fork at to hold the
    transcript up to that message and nothing after it (None: no such event is known):

    - a reply: its turn's `turn_ended` (the step that recorded it);
    - a tool result: its call's `tool_call_ended` (the step that recorded it; the phase's other
      results recorded before it are held too);
    - a user message a run started on: the last `state_changed` RUNNING between the reply before
      it (turn T-1) and the reply it got (turn T): the step that started the run recorded it (or,
      when the run went on after a Resume or a restart before its first reply, a later one that
      added nothing to the transcript). Only when that reply is on the page and the message is
      the one user message since the reply before it (or since the transcript's start, on its
      first page): a completion gate's feedback is recorded by no event of its own.

    A summary (compaction) and a system message have none."""
    seqs: list[int | None] = []
    for index, message in enumerate(messages):
        seq: int | None = None
        if message.summary:
            pass
        elif message.role == "assistant":
            seq = history.replies.get(message.turn)
        elif message.role == "tool":
            seq = history.results.get(message.tool_call_id)
        elif message.role == "user":
            seq = _run_start(messages, index, history, first_page)
        seqs.append(seq)
    return seqs


def _run_start(messages: Sequence[pb.Message], index: int, history: HandleHistory, first_page: bool) -> int | None:
    following = next((i for i in range(index + 1, len(messages)) if messages[i].role == "assistant"), None)
    before = next((i for i in range(index - 1, -1, -1) if messages[i].role == "assistant"), None)
    if following is None or (before is None and not first_page):
        return None
    start = 0 if before is None else before + 1
    users = [i for i in range(start, following) if messages[i].role == "user" and not messages[i].summary]
    if users != [index]:
        return None
    turn = messages[following].turn
    high = history.replies.get(turn)
    low = 0 if turn <= 1 else history.replies.get(turn - 1)
    if high is None or low is None:
        return None
    runs = [seq for seq in history.runs if low < seq < high]
    return runs[-1] if runs else None


async def fork_origin(client: Client, views: Sequence[pb.HandleView], runtime_id: str) -> tuple[str, int]:
    """The runtime this one was forked (or replayed) from and the fork's cut, from Inspect of
    one of its handles (a runtime with none says nothing): ("", 0) for one CreateRuntime made."""
    if not views:
        return "", 0
    inspected: pb.InspectResponse = await client.call(
        "Inspect", pb.InspectRequest(runtime_id=runtime_id, handle_id=views[0].handle_id)
    )
    return inspected.forked_from, inspected.fork_seq
