"""The pages and actions: each reads or does one thing through the gRPC API."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import grpc
from agentruntime.client import AgentRuntimeError
from agentruntime.v1 import agent_runtime_pb2 as pb
from aiohttp import web
from multidict import MultiDictProxy

from . import feeds, gateway, live
from .answers import answer_from_form, text_field
from .sessions import SESSION, Session
from .views import budget_text, cost_text, failure_name, json_text, limit_name, state_name, status_name, struct_text, tree_order

if TYPE_CHECKING:
    from .context import Console

RESUME_WAIT = 2.0  # seconds an answer's page waits for the Resume before it moves on (the run goes on)


def runtime_url(runtime_id: str) -> str:
    return f"/runtimes/{quote(runtime_id, safe='')}"


def transcript_url(runtime_id: str, handle_id: str, page: str = "") -> str:
    query = {"handle": handle_id, **({"page": page} if page else {})}
    return f"{runtime_url(runtime_id)}/transcript?{urlencode(query)}"


def confirm_url(runtime_id: str, action: str, handle_id: str) -> str:
    return f"{runtime_url(runtime_id)}/confirm?{urlencode({'action': action, 'handle': handle_id})}"


def depth(handle_id: str) -> int:
    return handle_id.count("/") - 1


HELPERS = {
    "runtime_url": runtime_url,
    "transcript_url": transcript_url,
    "confirm_url": confirm_url,
    "budget_text": budget_text,
    "cost_text": cost_text,
    "failure_name": failure_name,
    "json_text": json_text,
    "limit_name": limit_name,
    "state_name": state_name,
    "status_name": status_name,
    "struct_text": struct_text,
    "depth": depth,
    "runtime_status": gateway.runtime_status,
}


def _session(request: web.Request) -> Session:
    session: Session | None = request.get(SESSION)
    assert session is not None
    return session


def _client(request: web.Request) -> Any:
    return _session(request).client


class NotAForm(Exception):
    """A POST body the console cannot read as a form (a 400 page says why)."""


async def form_of(request: web.Request) -> MultiDictProxy[str | bytes | bytearray | web.FileField]:
    """The request's form; NotAForm for a body that is none (not UTF-8, say)."""
    try:
        return await request.post()
    except ValueError as error:  # (UnicodeDecodeError included)
        raise NotAForm(f"The form sent is not valid UTF-8 form data ({type(error).__name__}).") from None


def _violations(error: AgentRuntimeError) -> str:
    found = error.bad_request
    if found is None or not found.field_violations:
        return error.message
    return error.message + ": " + "; ".join(f"{v.field}: {v.description}" for v in found.field_violations)


async def _last_word(response: web.StreamResponse, message: str) -> None:
    """The page is told the stream ends, and why (it stops reconnecting)."""
    with contextlib.suppress(ConnectionError):
        await response.write(live.event_stream_bytes([{"t": "gone", "message": message}]))


def _unread(runtime_id: str, count: int) -> list[tuple[str, int]]:
    return [(runtime_id, count)] if count else []


def add_routes(app: web.Application, console: Console) -> None:
    console.templates.globals.update(HELPERS)
    render = console.render

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def home(request: web.Request) -> web.Response:
        raise web.HTTPSeeOther("/runtimes")

    async def runtimes(request: web.Request) -> web.Response:
        text = request.query.get("q", "")[:64]
        status = request.query.get("status", "")
        status = status if status in gateway.STATUSES else ""
        page_token = request.query.get("page", "")[:4096]
        found, next_token = await gateway.runtimes_page(_client(request), text, status, page_token)
        next_url = "/runtimes?" + urlencode({"q": text, "status": status, "page": next_token}) if next_token else ""
        return render(
            request, "runtimes.html", runtimes=found, q=text, status=status, statuses=gateway.STATUSES, next_url=next_url
        )

    async def runtime(request: web.Request) -> web.Response:
        runtime_id = request.match_info["runtime_id"]
        client = _client(request)
        views = sorted(await gateway.handles(client, runtime_id), key=lambda view: tree_order(view.handle_id))
        pending, unread = await gateway.pending_requests(client, runtime_id, views)
        forked_from, fork_seq = await gateway.fork_origin(client, views, runtime_id)
        return render(
            request,
            "runtime.html",
            runtime_id=runtime_id,
            handles=views,
            pending=pending,
            unread=_unread(runtime_id, unread),
            back="runtime",
            forked_from=forked_from,
            fork_seq=fork_seq,
        )

    async def requests_fragment(request: web.Request) -> web.Response:
        runtime_id = request.match_info["runtime_id"]
        client = _client(request)
        pending, unread = await gateway.pending_requests(client, runtime_id, await gateway.handles(client, runtime_id))
        shown: dict[str, Any] = {"pending": pending, "unread": _unread(runtime_id, unread)}
        return render(request, "requests.html", runtime_id=runtime_id, back="runtime", **shown)

    async def live_events(request: web.Request) -> web.StreamResponse:
        runtime_id = request.match_info["runtime_id"]
        session = _session(request)
        limits = console.limits
        # (X-Accel-Buffering: a proxy such as nginx passes each batch on as it comes)
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        response = web.StreamResponse(headers=headers)
        if len(console.streams) >= limits.live_streams:
            await response.prepare(request)
            await _last_word(response, f"the console follows as many live pages as it may ({limits.live_streams}): reload later")
            return response

        async def listed() -> set[str]:  # the handles the page has rows for (NOT_FOUND: a page)
            return {view.handle_id for view in await gateway.handles(session.client, runtime_id)}

        page = await console.feeds.join(session.credential, session.client, runtime_id, listed)
        streaming = asyncio.current_task()
        assert streaming is not None
        try:
            await response.prepare(request)
            while len(session.live) >= limits.live_streams_per_session:  # its own oldest page goes, told why
                oldest = session.live.pop(0)
                most = limits.live_streams_per_session
                console.ended[oldest] = f"more than {most} live pages are open in this session: reload this page to follow it"
                oldest.cancel()
            console.streams.add(streaming)  # ended at shutdown: a page would keep it open for ever
            session.live.append(streaming)
            while (data := await page.next()) != feeds.END:
                await response.write(data)
        except asyncio.CancelledError:  # the console stops, the session ended, or a newer page took its place
            reason = console.ended.pop(streaming, None)
            if reason is not None:
                await _last_word(response, reason)
        except ConnectionError:  # the page went away
            pass
        finally:
            page.feed.leave(page)
            console.streams.discard(streaming)
            console.ended.pop(streaming, None)
            if streaming in session.live:
                session.live.remove(streaming)
        return response

    async def transcript(request: web.Request) -> web.Response:
        runtime_id = request.match_info["runtime_id"]
        handle_id = request.query.get("handle", "")[:1024]
        client = _client(request)
        view = await client.inspect(runtime_id, handle_id)
        page_token = request.query.get("page", "")[:4096]
        page = await client.transcript_page(runtime_id, handle_id, gateway.TRANSCRIPT_PAGE, page_token)
        result = await gateway.settled_result(client, runtime_id, view)
        history = await gateway.handle_history(client, runtime_id, handle_id, page.messages)
        seqs = gateway.message_seqs(page.messages, history, first_page=not page_token)
        results = {message.tool_call_id: message for message in page.messages if message.role == "tool"}
        next_url = transcript_url(runtime_id, handle_id, page.next_page_token) if page.next_page_token else ""
        return render(
            request,
            "transcript.html",
            runtime_id=runtime_id,
            view=view,
            messages=list(page.messages),
            results=results,
            result=result,
            next_url=next_url,
            seqs=seqs,
        )

    async def inbox(request: web.Request) -> web.Response:
        skip = request.query.get("skip", "0")
        start = request.query.get("from", "")[:4096], int(skip) if skip.isdigit() and len(skip) <= 4 else 0
        page = await gateway.inbox(_client(request), *start)
        more = "/inbox?" + urlencode({"from": page.next_page[0], "skip": page.next_page[1]}) if page.next_page else ""
        return render(
            request,
            "inbox.html",
            pending=page.pending,
            unread=page.unread,
            more=more,
            page_waits=gateway.INBOX_WAITS,
            back="inbox",
        )

    async def confirm(request: web.Request) -> web.Response:
        runtime_id = request.match_info["runtime_id"]
        action = request.query.get("action", "")
        if action not in ("interrupt", "close"):
            raise web.HTTPBadRequest(text="action must be interrupt or close")
        handle_id = request.query.get("handle", "")[:1024]
        view = await _client(request).inspect(runtime_id, handle_id)  # NOT_FOUND: a page
        return render(request, "confirm.html", runtime_id=runtime_id, view=view, action=action)

    async def act(request: web.Request) -> web.StreamResponse:
        runtime_id = request.match_info["runtime_id"]
        action = request.match_info["action"]
        form = await form_of(request)
        handle_id = text_field(form, "handle")
        request_id = text_field(form, "request_id")[:128]
        client = _client(request)
        session = _session(request)
        try:
            if action == "interrupt":
                done = await client.interrupt(runtime_id, handle_id, request_id=request_id or None)
                session.flash("ok", f"Interrupted {handle_id}." if done else f"{handle_id} was not running.")
            else:
                closed = await client.close(runtime_id, handle_id, request_id=request_id or None)
                session.flash("ok", f"Closed {', '.join(closed) or handle_id}.")
        except AgentRuntimeError as error:
            if error.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                session.flash("error", f"{action.capitalize()} refused: {_violations(error)}")
            else:
                raise
        raise web.HTTPSeeOther(runtime_url(runtime_id))

    async def fork(request: web.Request) -> web.StreamResponse:
        """ForkRuntime at the event a transcript message's form names; then the fork's page."""
        runtime_id = request.match_info["runtime_id"]
        form = await form_of(request)
        at = text_field(form, "at_seq")
        if not at.isdigit() or len(at) > 18 or int(at) < 1:
            raise web.HTTPBadRequest(text="at_seq must be an event's seq: 1 or more")
        session = _session(request)
        try:
            forked = await _client(request).fork_runtime(
                runtime_id, int(at), request_id=text_field(form, "request_id")[:128] or None
            )
        except AgentRuntimeError as error:
            if error.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                session.flash("error", f"Fork refused: {_violations(error)}")
                raise web.HTTPSeeOther(runtime_url(runtime_id)) from None
            raise
        held = ", ".join(forked.held_handle_ids)
        session.flash(
            "ok",
            f"Forked {runtime_id} at event #{forked.fork_seq}."
            + (f" Held until a Wake: {held}." if held else " Nothing was in flight at the cut."),
        )
        raise web.HTTPSeeOther(runtime_url(forked.runtime_id))

    async def resume(request: web.Request) -> web.StreamResponse:
        runtime_id = request.match_info["runtime_id"]
        form = await form_of(request)
        session = _session(request)
        back = "/inbox" if form.get("back") == "inbox" else runtime_url(runtime_id)
        try:
            answer = answer_from_form(form)
        except ValueError as error:  # checked here, before anything is sent
            message = f"{str(error)[:1].upper()}{str(error)[1:]}. Go back to change it: the form keeps what you wrote."
            return render(request, "error.html", 400, title="Not sent", runtime_id="", message=message, back_url=back)
        call = asyncio.ensure_future(
            _client(request).resume(runtime_id, answer, request_id=text_field(form, "request_id")[:128] or None)
        )
        # A Resume answers when the run it continues settles: the page does not wait for that.
        done, _ = await asyncio.wait({call}, timeout=RESUME_WAIT)
        if not done:
            call.add_done_callback(_report_late(session))
            session.flash("ok", "Answer sent: the run goes on.")
            raise web.HTTPSeeOther(back)
        try:
            result = call.result()
        except AgentRuntimeError as error:
            if error.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                session.flash("error", f"The runtime refused the answer: {_violations(error)}")
                raise web.HTTPSeeOther(back) from None
            raise
        session.flash("ok", f"Answer sent: {result.handle_id} is {status_name(result.status).lower()}.")
        raise web.HTTPSeeOther(back)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", home)
    app.router.add_get("/runtimes", runtimes)
    app.router.add_get("/inbox", inbox)
    app.router.add_get("/runtimes/{runtime_id}", runtime)
    app.router.add_get("/runtimes/{runtime_id}/requests", requests_fragment)
    app.router.add_get("/runtimes/{runtime_id}/live", live_events)
    app.router.add_get("/runtimes/{runtime_id}/transcript", transcript)
    app.router.add_get("/runtimes/{runtime_id}/confirm", confirm)
    app.router.add_post("/runtimes/{runtime_id}/{action:interrupt|close}", act)
    app.router.add_post("/runtimes/{runtime_id}/resume", resume)
    app.router.add_post("/runtimes/{runtime_id}/fork", fork)


def _report_late(session: Session) -> Any:
    def report(call: asyncio.Future[pb.TaskResult]) -> None:
        if call.cancelled():
            return
        error = call.exception()
        if error is not None:
            session.flash("error", f"An answer sent earlier failed: {error}")

    return report
