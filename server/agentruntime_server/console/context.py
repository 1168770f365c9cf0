"""The console's state, one per process: its target, sessions, sign-in throttle, live feeds and
templates, and how a page is rendered."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from .feeds import Feeds
from .hosts import Site
from .limits import Limits
from .open_server import OpenServer
from .sessions import SESSION, Session, Sessions
from .target import Target
from .throttle import SignInThrottle

HERE = Path(__file__).parent


class Console:
    def __init__(self, target: Target, site: Site, limits: Limits) -> None:
        self.target = target
        self.site = site
        self.limits = limits
        self.sessions = Sessions(limits)
        self.throttle = SignInThrottle(limits)
        self.open_server = OpenServer(target)
        self.feeds = Feeds()  # the runtimes' Watches, each shared by the live pages of one token
        self.streams: set[asyncio.Task[Any]] = set()  # the live pages' event streams
        self.ended: dict[asyncio.Task[Any], str] = {}  # streams told to end, and why
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every text a model, a tool or a host wrote is hostile
            undefined=jinja2.StrictUndefined,
            enable_async=False,
        )
        self.templates.globals["static"] = _static_url

    def render(self, request: web.Request, name: str, http_status: int = 200, **values: Any) -> web.Response:
        session: Session | None = request.get(SESSION)
        values.setdefault("csrf", session.csrf if session else "")
        page = self.templates.get_template(name).render(
            session=session,
            flashes=session.take_flashes() if session else [],
            target=self.target.address,
            request_id=secrets.token_hex(16),  # a form's Resume, Interrupt or Close: once however often it is sent
            **values,
        )
        return web.Response(text=page, status=http_status, content_type="text/html", charset="utf-8")


_VERSIONED: dict[str, str] = {}


def _static_url(name: str) -> str:
    """`/static/console.js?v=...`: a changed file is fetched again, an unchanged one cached."""
    if name not in _VERSIONED:
        _VERSIONED[name] = hashlib.sha256((HERE / "static" / name).read_bytes()).hexdigest()[:12]
    return f"/static/{name}?v={_VERSIONED[name]}"
