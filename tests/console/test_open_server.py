"""In front of a server without authentication (AGENTRUNTIME_AUTH=none, what `make run` serves)
the console signs a person in without a form, and says so; in front of one with tokens it
still asks for one."""

from __future__ import annotations

from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.console_http import SECURITY_HEADERS, console_for, person, sign_in, signin_form
from tests.support.servers import serve
from tests.support.tenants import ACME, reply, scripted, tenant_server

OPEN = "no sign-in: the server has no authentication"


async def test_a_server_without_authentication_is_entered_without_a_form() -> None:
    async with serve() as served:  # AUTH=none
        await served.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="open-house", agents=[scripted("a", reply("x"))]))
        async with console_for(served.port) as url, person() as http:
            async with http.get(url + "/runtimes", allow_redirects=False) as page:
                html = await page.text()
                assert page.status == 200, (page.status, page.headers.get("Location"))
                assert OPEN in html and "open-house" in html and "Sign out" not in html
                assert all(name in page.headers for name in SECURITY_HEADERS)
            async with http.get(url + "/signin", allow_redirects=False) as form:
                assert (form.status, form.headers["Location"]) == (303, "/runtimes")
            async with http.post(url + "/signout", data={"csrf": "guess"}, headers={"Origin": url}) as forged:
                assert forged.status == 403  # the forms carry the session's CSRF token, checked as ever
            async with (
                person() as script,
                script.get(url + "/runtimes/open-house/live", headers={"Sec-Fetch-Mode": "cors"}) as live,
            ):
                assert live.status == 401  # a script's request is never what signs a person in


async def test_a_server_with_tokens_still_asks_for_one(tmp_path: Path) -> None:
    async with tenant_server(tmp_path) as served, console_for(served.port) as url, person() as http:
        async with http.get(url + "/runtimes", allow_redirects=False) as page:
            assert (page.status, page.headers["Location"]) == (303, "/signin")
        await signin_form(http, url)
        await sign_in(http, url, ACME[1])
        async with http.get(url + "/runtimes") as page:
            assert OPEN not in await page.text()
