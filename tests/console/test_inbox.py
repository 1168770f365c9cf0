"""The inbox reads a bounded number of calls a page, counted where they land: the server's own
metrics (grpc_server_started_total, scraped over HTTP), a real server and a real console."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from html import unescape
from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.console_http import console_for, person, sign_in, started_calls
from tests.support.servers import Served
from tests.support.tenants import ACME, ASKER, Caller, tenant_server

RUNTIMES, WAITING = 60, 3  # 180 Requests: more than a page holds
REQUEST = re.compile(r'<article class="request" data-request="([^"]+)".*?action="/runtimes/([^"/]+)/resume"', re.DOTALL)
MORE = re.compile(r'<a id="more" href="([^"]+)"')


async def waiting_runtimes(served: Served) -> set[tuple[str, str]]:
    """RUNTIMES runtimes with WAITING handles each suspended on a relay call: (runtime, Request)."""
    acme = Caller(served.stub, ACME)
    gate = asyncio.Semaphore(8)

    async def one(number: int) -> list[tuple[str, str]]:
        async with gate:
            runtime_id = f"desk-{number:03d}"
            await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[ASKER]))
            found = []
            for _ in range(WAITING):
                _, result = await acme.run(runtime_id, "asker", "look it up")
                assert result.status == pb.STATUS_PENDING
                found.append((runtime_id, result.pending.id))
            return found

    return {request for found in await asyncio.gather(*(one(n) for n in range(RUNTIMES))) for request in found}


async def test_an_inbox_page_makes_a_bounded_number_of_calls_and_the_pages_show_every_request(tmp_path: Path) -> None:
    async with tenant_server(tmp_path, metrics_listen="127.0.0.1:0") as served:
        expected = await waiting_runtimes(served)
        assert len(expected) == RUNTIMES * WAITING
        async with console_for(served.port) as url, person() as http:
            await sign_in(http, url, ACME[1])
            shown: list[tuple[str, str]] = []
            pages: list[Counter[str]] = []
            path = "/inbox"
            while path:
                before = await started_calls(served)
                async with http.get(url + path, allow_redirects=False) as page:
                    assert page.status == 200
                    html = await page.text()
                pages.append(await started_calls(served) - before)
                shown.extend((unescape(runtime_id), unescape(request_id)) for request_id, runtime_id in REQUEST.findall(html))
                more = MORE.search(html)
                path = unescape(more.group(1)) if more else ""
                assert len(pages) <= 10, "the inbox's pages never end"
    # At most 50 Waits a page (a form each), a List per runtime read, ten pages of ListRuntimes.
    for calls in pages:
        assert calls["Wait"] <= 50 and calls["List"] <= calls["Wait"] and calls["ListRuntimes"] <= 10, calls
        assert sum(calls.values()) <= 110, calls
    assert sorted(shown) == sorted(expected)  # each once, over the pages
    assert sum(pages[0].values()) < 2 + RUNTIMES * (1 + WAITING)  # what one page used to make
