"""The console over plain HTTP (aiohttp's client), for what a browser does not show: the
headers, the status codes, a flood of requests, a Host header of another name. The runtime is
a real server (the tenants' tokens, or no authentication); each console is built with the
options its test gives, on a free loopback port, and each person is a client session with a
cookie jar of its own."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agentruntime_server.console.app import build
from agentruntime_server.console.target import Target
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import Served
from tests.support.tenants import tenant_server

CSRF = re.compile(r'name="csrf" value="([^"]*)"')
SECURITY_HEADERS = ("Content-Security-Policy", "X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """A real server with the tenants' tokens (tests/support/tenants.py)."""
    async with tenant_server(tmp_path) as running:
        yield running


@asynccontextmanager
async def console_for(server_port: int, token: str | None = None, **options: Any) -> AsyncIterator[str]:
    """A console in front of the server on `server_port` (`token`: its --token); its URL."""
    runner = web.AppRunner(build(Target(f"127.0.0.1:{server_port}", token=token), **options), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def person() -> AsyncIterator[aiohttp.ClientSession]:
    """A browser's cookie jar (the console is on an IP address: `unsafe` keeps its cookies)."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        yield http


async def signin_form(http: aiohttp.ClientSession, url: str, **headers: str) -> str:
    """GET /signin: the form's CSRF token."""
    async with http.get(url + "/signin", headers=headers, allow_redirects=False) as page:
        assert page.status == 200, (page.status, await page.text())
        found = CSRF.search(await page.text())
        assert found is not None
        return found.group(1)


async def post_signin(http: aiohttp.ClientSession, url: str, csrf: str, token: str, **headers: str) -> aiohttp.ClientResponse:
    """The sign-in form sent (from the console's own page unless `headers` say otherwise)."""
    sent = {"Origin": url, **headers}
    async with http.post(url + "/signin", data={"csrf": csrf, "token": token}, headers=sent, allow_redirects=False) as answer:
        await answer.read()
        return answer


async def sign_in(http: aiohttp.ClientSession, url: str, token: str) -> None:
    answer = await post_signin(http, url, await signin_form(http, url), token)
    assert (answer.status, answer.headers.get("Location")) == (303, "/runtimes"), answer.status


async def page_csrf(http: aiohttp.ClientSession, url: str, path: str = "/runtimes") -> str:
    """The CSRF token of a signed-in person's forms."""
    async with http.get(url + path, allow_redirects=False) as page:
        assert page.status == 200, (page.status, await page.text())
        found = CSRF.search(await page.text())
        assert found is not None
        return found.group(1)


async def live_messages(response: aiohttp.ClientResponse, until: Any, timeout: float = 20) -> list[dict[str, Any]]:
    """The live stream's messages (JSON), read until `until(messages)` holds."""
    messages: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while not until(messages):
            line = await response.content.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                messages.append(json.loads(line[6:]))
    return messages


async def started_calls(served: Served, metric: str = "grpc_server_started_total") -> Counter[str]:
    """RPCs the server has started (or with `grpc_server_handled_total`, ended), by method: its
    /metrics, scraped over HTTP."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{served.running.metrics_port}/metrics") as page:
        text = await page.text()
    calls: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric:
                calls[sample.labels["grpc_method"]] += int(sample.value)
    return calls
