"""The console's web application: the Host allow-list, sessions, CSRF, security headers, error
pages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
from agentruntime.client import AgentRuntimeError
from aiohttp import web

from . import pages, signin
from .context import HERE, Console
from .hosts import Site, refusal_page
from .limits import Limits
from .sessions import COOKIE, FORM_COOKIE, SESSION, Session, SessionsFull, set_cookie
from .target import Target

log = logging.getLogger(__name__)

CONSOLE_KEY: web.AppKey[Console] = web.AppKey("console")
NEW_SESSION = web.RequestKey("new_session", Session)  # a session made by this request: its cookie goes with the answer
# Every script, style and image is the console's own: nothing inline, nothing from elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
OPEN_PATHS = ("/signin", "/static/", "/healthz")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def security_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """On every answer, as its headers are sent: pages, errors, static files, the live stream."""
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")  # (no-referrer makes a form's Origin "null")
    response.headers.setdefault("X-Frame-Options", "DENY")
    if not request.path.startswith("/static/"):
        response.headers.setdefault("Cache-Control", "no-store")
    made = request.get(NEW_SESSION)
    if made is not None and isinstance(request, web.Request):  # opened by this request (a runtime without authentication)
        console = request.app[CONSOLE_KEY]
        set_cookie(response, made, console.target.secure_cookies, console.limits.session_idle)


@web.middleware
async def hosts(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request for a name this console is not known by (a DNS-rebinding page) is refused."""
    host = request.headers.get("Host")
    if host is not None and not request.app[CONSOLE_KEY].site.allows(host):
        return web.Response(text=refusal_page(host), status=421, content_type="text/html", charset="utf-8")
    return await handler(request)


@web.middleware
async def sessions(request: web.Request, handler: Handler) -> web.StreamResponse:
    console = request.app[CONSOLE_KEY]
    session = console.sessions.get(request.cookies.get(COOKIE))
    if session is not None:
        request[SESSION] = session
    if request.method not in ("GET", "HEAD"):
        if session is None and request.path != "/signin":
            raise web.HTTPUnauthorized(text="sign in first")
        if not await _form_ok(request, console, session):
            raise web.HTTPForbidden(text="This form is stale or came from another site: reload the page and try again.")
        return await handler(request)
    if session is None and not request.path.startswith(OPEN_PATHS):
        # A page is sent to the sign-in form (or signed in, before a runtime without
        # authentication); a script's request (the live stream, a fragment) is refused, lest
        # its answer mint a session that replaces the page's own.
        if request.headers.get("Sec-Fetch-Mode", "navigate") != "navigate":
            raise web.HTTPUnauthorized(text="sign in first")
        opened = await signin.open_session(request, console)
        if opened is None:
            raise web.HTTPSeeOther("/signin")
        request[SESSION] = request[NEW_SESSION] = opened
    return await handler(request)


async def _form_ok(request: web.Request, console: Console, session: Session | None) -> bool:
    """A browser names the page a form came from (Origin, else Referer): one of this console's
    names. The form carries its CSRF token: the session's, or the sign-in form's signed one."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    if origin is not None and not console.site.allows_origin(origin, request.headers.get("Host", "")):
        return False  # ("null" too; no header at all: not a browser's cross-site form)
    sent = await _csrf_sent(request)
    if request.path == "/signin":
        return console.sessions.form_csrf_ok(request.cookies.get(FORM_COOKIE), sent)
    return session is not None and session.csrf_ok(sent)


async def _csrf_sent(request: web.Request) -> str | None:
    if "X-CSRF-Token" in request.headers:
        return request.headers["X-CSRF-Token"]
    value = (await pages.form_of(request)).get("csrf")
    return value if isinstance(value, str) else None


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The runtime's refusals, and the console's own failures, as pages a person can act on."""
    console = request.app[CONSOLE_KEY]
    try:
        return await handler(request)
    except AgentRuntimeError as error:
        return _refused(request, console, error)
    except pages.NotAForm as error:
        return console.render(request, "error.html", 400, title="Not a valid form", runtime_id="", message=str(error))
    except SessionsFull as error:
        message = f"Nobody more can sign in now: {error}. Try again later."
        return console.render(request, "error.html", 503, title="The console is full", runtime_id="", message=message)
    except web.HTTPNotFound as missing:
        if missing.text != "404: Not Found":
            raise
        message = "The console has no page at this address."
        return console.render(request, "error.html", 404, title="Not found", runtime_id="", message=message)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("console: %s %s failed", request.method, request.path)
        message = "The console failed to answer this request (its log says why). Try again, or go back."
        return console.render(request, "error.html", 500, title="The console failed", runtime_id="", message=message)


def _refused(request: web.Request, console: Console, error: AgentRuntimeError) -> web.StreamResponse:
    session: Session | None = request.get(SESSION)
    if error.code is grpc.StatusCode.UNAUTHENTICATED:
        if session is not None:
            if session.open:
                console.open_server.forget()  # the runtime asks for tokens now
            console.sessions.sign_out(session)
        request.pop(NEW_SESSION, None)
        signed_out = web.HTTPSeeOther("/signin?signed_out=1")
        signed_out.del_cookie(COOKIE, path="/")
        raise signed_out
    if error.code is grpc.StatusCode.NOT_FOUND:
        runtime_id = request.match_info.get("runtime_id", "")
        return console.render(request, "error.html", 404, title="Not found", runtime_id=runtime_id, message=error.message)
    if error.code is grpc.StatusCode.PERMISSION_DENIED:
        return console.render(request, "error.html", 403, title="Not allowed", runtime_id="", message=error.message)
    if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        message = f"The runtime at {console.target.address} did not answer ({error.message})."
        return console.render(request, "error.html", 503, title="Runtime unavailable", runtime_id="", message=message)
    if error.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):  # (a link edited by hand)
        return console.render(request, "error.html", 400, title="Not a valid request", runtime_id="", message=error.message)
    code = error.code.name if error.code else "UNKNOWN"
    return console.render(request, "error.html", 502, title=f"The runtime said {code}", runtime_id="", message=error.message)


def build(target: Target, site: Site | None = None, limits: Limits | None = None) -> web.Application:
    console = Console(target, site or Site(), limits or Limits())
    app = web.Application(middlewares=[hosts, errors, sessions], client_max_size=1 << 20)
    app[CONSOLE_KEY] = console
    signin.add_routes(app, console)
    pages.add_routes(app, console)
    app.router.add_static("/static/", HERE / "static", append_version=False)
    app.on_response_prepare.append(security_headers)

    async def ending_streams(app: web.Application) -> None:
        for task in list(console.streams):
            task.cancel()
        feeds = console.feeds.close()
        if feeds:
            await asyncio.wait(feeds, timeout=5.0)  # (a stop is never held up for long)

    async def closing(app: web.Application) -> None:
        await console.sessions.close()
        await console.open_server.close()

    app.on_shutdown.append(ending_streams)
    app.on_cleanup.append(closing)
    return app
