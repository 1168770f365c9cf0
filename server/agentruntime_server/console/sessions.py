"""Signed-in people. A random session id in an HttpOnly, SameSite=Strict cookie names a session
kept here, in the console's memory, with the client of the person's token (never sent to the
browser) and a CSRF token for its forms.

Nobody is stored before signing in: the sign-in form's CSRF token is signed (an HMAC of a
random value in a cookie of its own, and the time), so no flood of forms can spoil one already
open. Signed-in sessions are grouped by token and by client address: a group past its cap loses
its own least recently used session, and the console past its cap refuses a new sign-in rather
than sign anyone out, so no tenant can sign another's people out. Sessions of one token share
one client (one channel to the runtime)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import TypeVar

from agentruntime.client import Client
from aiohttp import hdrs, web

from .limits import Limits

COOKIE = "agentruntime_console"
FORM_COOKIE = "agentruntime_console_form"  # the sign-in form's random value
FORM_LIFETIME = 12 * 3600  # seconds a sign-in form may be sent after it was shown
OPEN = "open"  # the credential of sessions signed in without a token (a runtime without authentication)
K = TypeVar("K")


@dataclass(eq=False)
class Session:
    id: str
    csrf: str
    credential: str  # a keyed digest of the token, never the token
    client_key: str  # the client address it signed in from (throttle.client_key)
    client: Client
    open: bool = False  # signed in without a form: the runtime has no authentication
    last_seen: float = field(default_factory=time.monotonic)
    flashes: list[tuple[str, str]] = field(default_factory=list)  # (kind, text) shown once
    live: list[asyncio.Task[object]] = field(default_factory=list)  # its live streams, oldest first

    def csrf_ok(self, sent: str | None) -> bool:
        return sent is not None and sent != "" and hmac.compare_digest(sent.encode(), self.csrf.encode())

    def flash(self, kind: str, text: str) -> None:
        self.flashes.append((kind, text))

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        return taken


class SessionsFull(Exception):
    """The console holds as many sessions as it may: a sign-in is refused, nobody signed out."""


@dataclass
class _Shared:
    client: Client
    users: int = 0


class Sessions:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._key = secrets.token_bytes(32)  # signs forms and keys tokens; a restart signs everyone out anyway
        self._by_id: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._groups: dict[tuple[str, str], OrderedDict[str, None]] = {}  # (credential, client): ids, LRU first
        self._credentials: dict[str, OrderedDict[str, None]] = {}
        self._clients: dict[str, _Shared] = {}  # credential: the client its sessions share
        self._closing: set[asyncio.Task[None]] = set()

    # ---- the sign-in form ----------------------------------------------------------------------

    def form_csrf(self, nonce: str) -> str:
        issued = str(int(time.time()))
        return f"{issued}.{self._mac('form', nonce, issued)}"

    def form_csrf_ok(self, nonce: str | None, sent: str | None) -> bool:
        if not nonce or not sent or "." not in sent:
            return False
        issued, _, mac = sent.partition(".")
        if not issued.isdigit() or not 0 <= time.time() - int(issued) <= FORM_LIFETIME:
            return False
        return hmac.compare_digest(mac.encode(), self._mac("form", nonce, issued).encode())

    def _mac(self, *parts: str) -> str:
        return hmac.new(self._key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()

    # ---- sessions ------------------------------------------------------------------------------

    def credential(self, token: str | None) -> str:
        """What sessions of one token share (a keyed digest: the token is kept in its client only)."""
        return self._mac("token", token or "")

    def shared_client(self, credential: str) -> Client | None:
        shared = self._clients.get(credential)
        return shared.client if shared is not None else None

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.last_seen > self.limits.session_idle:
            self._drop(session)
            return None
        session.last_seen = now
        self._by_id.move_to_end(session.id)
        self._groups[(session.credential, session.client_key)].move_to_end(session.id)
        self._credentials[session.credential].move_to_end(session.id)
        return session

    def admit(self, credential: str, client: Client, client_key: str, open: bool = False) -> Session:
        """A session for a person whose token `client` was tried with (and accepted). Its group's
        least recently used session goes if the group is full; SessionsFull if the console is."""
        self._expire()
        limits = self.limits
        group = self._groups.get((credential, client_key), OrderedDict())
        if len(group) >= limits.sessions_per_client:
            self._drop(self._by_id[next(iter(group))])
        same = self._credentials.get(credential, OrderedDict())
        if len(same) >= limits.sessions_per_credential:
            self._drop(self._by_id[next(iter(same))])
        if len(self._by_id) >= limits.sessions:
            if self.shared_client(credential) is not client:
                self._close_later(client)
            raise SessionsFull(f"the console holds {limits.sessions} sessions, as many as it may")
        shared = self._clients.get(credential)
        if shared is None:
            shared = self._clients[credential] = _Shared(client)
        elif shared.client is not client:  # tried with a client of its own meanwhile: one is enough
            self._close_later(client)
        shared.users += 1
        session = Session(
            id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            credential=credential,
            client_key=client_key,
            client=shared.client,
            open=open,
        )
        self._by_id[session.id] = session
        self._groups.setdefault((credential, client_key), OrderedDict())[session.id] = None
        self._credentials.setdefault(credential, OrderedDict())[session.id] = None
        return session

    def sign_out(self, session: Session) -> None:
        self._drop(session)

    def _expire(self) -> None:
        """Sessions idle past their lifetime, least recently used first."""
        now = time.monotonic()
        while self._by_id:
            oldest = next(iter(self._by_id.values()))
            if now - oldest.last_seen <= self.limits.session_idle:
                return
            self._drop(oldest)

    def _drop(self, session: Session) -> None:
        if self._by_id.pop(session.id, None) is None:
            return
        _forget(self._groups, (session.credential, session.client_key), session.id)
        _forget(self._credentials, session.credential, session.id)
        for stream in session.live:
            stream.cancel()
        session.live.clear()
        shared = self._clients.get(session.credential)
        if shared is not None:
            shared.users -= 1
            if shared.users <= 0:
                del self._clients[session.credential]
                self._close_later(shared.client)

    def _close_later(self, client: Client) -> None:
        # closed in the background: a channel's close waits for its calls (a live Watch)
        task = asyncio.get_running_loop().create_task(client.close_channel())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for shared in list(self._clients.values()):
            await shared.client.close_channel()
        self._clients.clear()
        self._by_id.clear()
        self._groups.clear()
        self._credentials.clear()


def _forget(index: dict[K, OrderedDict[str, None]], key: K, session_id: str) -> None:
    members = index.get(key)
    if members is not None:
        members.pop(session_id, None)
        if not members:
            del index[key]


def set_cookie(response: web.StreamResponse, session: Session, secure: bool, lifetime: float) -> None:
    """The session's id, for this console's pages only: never to a script, never on a request
    another site starts. A header of its own, so that it can be added as the response's headers
    go out (aiohttp's cookies are written before on_response_prepare)."""
    jar: SimpleCookie = SimpleCookie()
    jar[COOKIE] = session.id
    morsel = jar[COOKIE]
    morsel.update({"httponly": "1", "samesite": "Strict", "path": "/", "max-age": str(int(lifetime))})
    if secure:
        morsel["secure"] = "1"
    response.headers.add(hdrs.SET_COOKIE, morsel.OutputString())


def set_form_cookie(response: web.StreamResponse, nonce: str, secure: bool) -> None:
    response.set_cookie(FORM_COOKIE, nonce, httponly=True, samesite="Strict", secure=secure, path="/", max_age=FORM_LIFETIME)


SESSION = web.RequestKey("session", Session)  # the request's session, when it has one
