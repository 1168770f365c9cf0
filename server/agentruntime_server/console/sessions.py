"""Signed-in people: a random session id in an HttpOnly, SameSite=Strict cookie names a
session kept here, in the console's memory, with the person's token (never sent to the
browser), a CSRF token for its forms, and a client of its own."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from agentruntime.client import Client
from aiohttp import web

COOKIE = "agentruntime_console"
IDLE_LIFETIME = 12 * 3600.0  # seconds a session lives without a request
MAX_SESSIONS = 1000  # the oldest go first


@dataclass
class Session:
    id: str
    csrf: str
    client: Client | None = None  # None until signed in
    last_seen: float = field(default_factory=time.monotonic)
    flashes: list[tuple[str, str]] = field(default_factory=list)  # (kind, text) shown once

    @property
    def signed_in(self) -> bool:
        return self.client is not None

    def csrf_ok(self, sent: str | None) -> bool:
        return sent is not None and sent != "" and hmac.compare_digest(sent.encode(), self.csrf.encode())

    def flash(self, kind: str, text: str) -> None:
        self.flashes.append((kind, text))

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        return taken


class Sessions:
    def __init__(self) -> None:
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.last_seen > IDLE_LIFETIME:
            self._drop(session_id)
            return None
        session.last_seen = now
        self._by_id.move_to_end(session_id)
        return session

    def new(self) -> Session:
        while len(self._by_id) >= MAX_SESSIONS:
            # The oldest not signed in goes first: a flood of sign-in forms signs nobody out.
            anonymous = next((key for key, session in self._by_id.items() if not session.signed_in), None)
            self._drop(anonymous or next(iter(self._by_id)))
        session = Session(id=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32))
        self._by_id[session.id] = session
        return session

    def sign_in(self, before: Session, client: Client) -> Session:
        """A fresh session id at sign-in (an id known before it, to anyone, is worth nothing),
        with the client the person's token was tried with."""
        self._drop(before.id)
        session = self.new()
        session.client = client
        return session

    def sign_out(self, session: Session) -> None:
        self._drop(session.id)

    def _drop(self, session_id: str) -> None:
        session = self._by_id.pop(session_id, None)
        if session is not None and session.client is not None:
            # closed in the background: a channel's close waits for its calls (a live Watch)
            task = asyncio.get_running_loop().create_task(session.client.close_channel())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            session.client = None

    async def close(self) -> None:
        for session in list(self._by_id.values()):
            if session.client is not None:
                await session.client.close_channel()
        self._by_id.clear()


def set_cookie(response: web.StreamResponse, session: Session, secure: bool) -> None:
    """The session's id, for this console's pages only: never to a script, never on a request
    another site starts."""
    response.set_cookie(COOKIE, session.id, httponly=True, samesite="Strict", secure=secure, path="/", max_age=int(IDLE_LIFETIME))


SESSION = web.RequestKey("session", Session)  # the request's session, when it has one
