"""A tool that suspends: an HTTP tool at a loopback sign-in server that answers a call without an
answer with HTTP 202 and an `authorization` Request (expiring in `expires_in` seconds), and
one with the host's answer with 200; and the model of an agent that calls it once."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.support.loopback import Loopback
from tests.support.model_server import Reply, tool_results

ANSWER = "Agentruntime-Answer"


@dataclass
class SignInTool(Loopback):
    """HTTP 202 with an `authorization` Request on a call without an answer; 200 with one."""

    expires_in: float = 3600.0
    calls: list[tuple[str, str | None]] = field(default_factory=list)  # (Idempotency-Key, answer header)
    expires_at: str = ""

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/signin"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/signin", self._hit)

    async def _hit(self, request: web.Request) -> web.Response:
        answer = request.headers.get(ANSWER)
        self.calls.append((request.headers.get("Idempotency-Key", ""), answer))
        if answer is None:
            when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.expires_in)
            self.expires_at = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            body = {
                "kind": "authorization",
                "prompt": "sign in",
                "url": "https://example.invalid/login",
                "expires_at": self.expires_at,
                "data": {"session": "s1"},
            }
            return web.json_response(body, status=202)
        return web.Response(text="signed in as ada")


@pytest.fixture
async def signin() -> AsyncIterator[SignInTool]:
    server = SignInTool()
    await server.start()
    yield server
    await server.stop()


def crm_script(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("crm_login", {"user": "ada"})], tokens=10)
    last_tool = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
    return Reply(text=f"crm: {last_tool}", tokens=10)
