"""Signing in and out: the form (its CSRF token signed, nothing stored), the throttle on failed
tokens, and no form at all before a runtime without authentication."""

from __future__ import annotations

import logging
import math
import secrets
from typing import TYPE_CHECKING

import grpc
from agentruntime.client import AgentRuntimeError
from aiohttp import web

from .answers import text_field
from .pages import form_of
from .sessions import COOKIE, FORM_COOKIE, OPEN, SESSION, Session, SessionsFull, set_cookie, set_form_cookie
from .throttle import client_key

if TYPE_CHECKING:
    from .context import Console

log = logging.getLogger(__name__)

SIGNED_OUT = "The runtime did not accept your token (any more): sign in again."


async def open_session(request: web.Request, console: Console) -> Session | None:
    """A session for a person before a runtime without authentication (None before any other)."""
    if not await console.open_server.check():
        return None
    client = console.sessions.shared_client(OPEN) or console.target.client(None, default_token=False)
    return console.sessions.admit(OPEN, client, client_key(request.remote), open=True)


def add_routes(app: web.Application, console: Console) -> None:
    secure = console.target.secure_cookies

    def form(request: web.Request, http_status: int, error: str) -> web.Response:
        """The sign-in form, with a CSRF token signed for the browser's form cookie."""
        nonce = request.cookies.get(FORM_COOKIE) or secrets.token_urlsafe(32)
        response = console.render(request, "signin.html", http_status, error=error, csrf=console.sessions.form_csrf(nonce))
        set_form_cookie(response, nonce, secure)
        return response

    async def signin_page(request: web.Request) -> web.StreamResponse:
        if request.get(SESSION) is not None:
            raise web.HTTPSeeOther("/runtimes")
        opened = await open_session(request, console)
        if opened is not None:
            found = web.HTTPSeeOther("/runtimes")
            set_cookie(found, opened, secure, console.limits.session_idle)
            raise found
        return form(request, 200, SIGNED_OUT if request.query.get("signed_out") else "")

    async def signin(request: web.Request) -> web.StreamResponse:
        client = client_key(request.remote)
        wait = console.throttle.retry_after(client)
        if wait:
            log.warning("console sign-in refused from %s: too many failures; it may try again in %d s", client, math.ceil(wait))
            refused = form(request, 429, f"Too many failed sign-ins from your address: try again in {math.ceil(wait)} s.")
            refused.headers["Retry-After"] = str(math.ceil(wait))
            return refused
        token = text_field(await form_of(request), "token").strip() or None
        credential = console.sessions.credential(token)
        shared = console.sessions.shared_client(credential)
        tried = shared or console.target.client(token)
        try:
            await tried.list_runtimes_page(1)
        except BaseException as error:
            # Refused, or given up by the browser mid-call (cancelled): either way a channel
            # opened for it goes.
            if shared is None:
                await tried.close_channel()
            if not isinstance(error, AgentRuntimeError):
                raise
            return form(request, 401, _refusal(console, client, token, error))
        before = request.get(SESSION)
        try:
            signed = console.sessions.admit(credential, tried, client)
        except SessionsFull as full:
            log.warning("console sign-in refused from %s: %s", client, full)
            return form(request, 503, f"Nobody more can sign in now ({full}): try again later.")
        if before is not None:
            console.sessions.sign_out(before)
        log.info("console sign-in from %s", client)
        signed_in = web.HTTPSeeOther("/runtimes")
        set_cookie(signed_in, signed, secure, console.limits.session_idle)
        raise signed_in

    async def signout(request: web.Request) -> web.StreamResponse:
        session = request.get(SESSION)
        if session is not None:
            console.sessions.sign_out(session)
        signed_out = web.HTTPSeeOther("/signin")
        signed_out.del_cookie(COOKIE, path="/")
        raise signed_out

    app.router.add_get("/signin", signin_page)
    app.router.add_post("/signin", signin)
    app.router.add_post("/signout", signout)


def _refusal(console: Console, client: str, token: str | None, error: AgentRuntimeError) -> str:
    """What the form says of a token the runtime refused; a wrong one counts against the client
    and is logged (never the token)."""
    if error.code is grpc.StatusCode.UNAUTHENTICATED:
        if token is None:
            return "The runtime asks for a token."
        failures = console.throttle.failed(client)
        window = int(console.limits.signin_window)
        log.warning(
            "console sign-in refused from %s: the runtime did not accept the token (%d failures from there in the last %d s)",
            client,
            failures,
            window,
        )
        return "The runtime did not accept that token."
    if error.code is grpc.StatusCode.PERMISSION_DENIED:
        return f"That token may not list runtimes: {error.message}"
    return f"The runtime at {console.target.address} did not answer: {error.message}"
