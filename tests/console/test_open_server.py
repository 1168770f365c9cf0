"""In front of a server without authentication (AGENTRUNTIME_AUTH=none, what `make run` serves)
the console signs a person in without a form, and says so (over HTTP, and in Chromium, whose
live page then goes live with the cookie it was given); in front of one with tokens it still
asks for one."""

from __future__ import annotations

from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support.console import Stack, driver, open_stack, until
from tests.support.console_http import SECURITY_HEADERS, console_for, person, sign_in, signin_form
from tests.support.servers import serve
from tests.support.tenants import ACME, DEFAULT, reply, scripted, tenant_server

__all__ = ["driver", "open_stack"]  # fixtures of tests/support, used here

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
                assert "agentruntime_console=" in page.headers.get("Set-Cookie", "")  # the session it opened
            async with http.get(url + "/signin", allow_redirects=False) as form:
                assert (form.status, form.headers["Location"]) == (303, "/runtimes")
                assert "Set-Cookie" not in form.headers  # the same session: none opened again
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


def test_in_chromium_a_runtime_page_of_a_server_without_authentication_goes_live(driver: WebDriver, open_stack: Stack) -> None:
    runtime_id = open_stack.create(DEFAULT, "open-tree", scripted("a", reply("x", tokens=4)))
    handle_id = open_stack.start_run(DEFAULT, runtime_id, "a", "go")
    open_stack.wait(DEFAULT, runtime_id, handle_id)
    driver.delete_all_cookies()
    driver.get(f"{open_stack.console_url}/runtimes/{runtime_id}")
    assert driver.find_element(By.ID, "open-server").text == OPEN
    until(driver, lambda d: d.find_element(By.ID, "live-state").text == "live", "the live stream")
    assert driver.find_elements(By.CSS_SELECTOR, f'#tree tr[data-id="{handle_id}"]')
    cookie = driver.get_cookie("agentruntime_console")
    assert cookie is not None and cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
