"""Sessions and sign-in over plain HTTP against a real server: one tenant's sign-ins cannot sign
another's person out, a flood of anonymous sign-in forms cannot spoil one already open, and
failed sign-ins are throttled per client and logged without the token."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from agentruntime_server.console.limits import Limits

from tests.support.console_http import console_for, person, post_signin, served, sign_in, signin_form
from tests.support.poll import eventually
from tests.support.servers import Served
from tests.support.tenants import ACME, GLOBEX

__all__ = ["served"]  # the fixture of tests/support/console_http, used here


async def test_one_tenants_sign_ins_do_not_sign_another_tenants_person_out(served: Served) -> None:
    async with console_for(served.port) as url, person() as globex:
        await sign_in(globex, url, GLOBEX[1])
        gate = asyncio.Semaphore(8)

        async def acme_signs_in() -> None:
            async with gate, person() as http:
                await sign_in(http, url, ACME[1])

        await asyncio.gather(*(acme_signs_in() for _ in range(1005)))  # the old table held 1,000
        async with globex.get(url + "/runtimes", allow_redirects=False) as page:
            assert page.status == 200, "globex's person was signed out"


async def test_a_flood_of_anonymous_sign_in_forms_does_not_spoil_a_form_already_open(served: Served) -> None:
    async with console_for(served.port) as url, person() as someone:
        csrf = await signin_form(someone, url)
        gate = asyncio.Semaphore(8)

        async def anonymous() -> None:
            async with gate, aiohttp.ClientSession() as http, http.get(url + "/signin") as page:
                assert page.status == 200

        await asyncio.gather(*(anonymous() for _ in range(1000)))
        signed = await post_signin(someone, url, csrf, ACME[1])
        assert (signed.status, signed.headers.get("Location")) == (303, "/runtimes")


async def test_sign_in_is_throttled_per_client_and_each_failure_is_logged_without_the_token(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with console_for(served.port) as url, person() as http:
        csrf = await signin_form(http, url)
        wrong = [f"guess-{number:03d}-not-a-token" for number in range(20)]
        statuses = [(await post_signin(http, url, csrf, token)).status for token in wrong]
        assert statuses[0] == 401 and statuses[-1] == 429
        right = await post_signin(http, url, csrf, ACME[1])
        assert right.status == 429 and int(right.headers["Retry-After"]) > 0
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "sign-in refused" in logged and "127.0.0.1" in logged
    assert not any(token in logged for token in [*wrong, ACME[1]])


async def test_after_the_throttle_window_the_right_token_signs_in(served: Served) -> None:
    limits = Limits(signin_failures=3, signin_window=5.0)
    async with console_for(served.port, limits=limits) as url, person() as http:
        csrf = await signin_form(http, url)
        for _ in range(3):
            assert (await post_signin(http, url, csrf, "not-a-token")).status == 401
        held = await post_signin(http, url, csrf, ACME[1])
        assert held.status == 429 and 1 <= int(held.headers["Retry-After"]) <= 5

        async def signed_in() -> bool:
            return (await post_signin(http, url, csrf, ACME[1])).status == 303

        await eventually(signed_in, "a sign-in once the window passed", timeout=20)
