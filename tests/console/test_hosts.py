"""The names the console answers to, over plain HTTP against a real server: a DNS-rebinding page
(its Host and Origin are its own name) refused, before a console started with a token too, and
names given with --allow-host served, with Origins checked against them."""

from __future__ import annotations

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.console.hosts import Site

from tests.support.console_http import SECURITY_HEADERS, console_for, person, post_signin, served, signin_form
from tests.support.servers import Served
from tests.support.tenants import ACME, Caller, reply, scripted

__all__ = ["served"]  # the fixture of tests/support/console_http, used here


def rebinding(url: str) -> dict[str, str]:
    """The headers of a page of rebind.example whose name now points at the console's address."""
    port = url.rsplit(":", 1)[1]
    return {"Host": f"rebind.example:{port}", "Origin": f"http://rebind.example:{port}"}


async def test_a_request_for_another_host_name_is_refused_with_a_short_page(served: Served) -> None:
    async with console_for(served.port) as url, person() as http:
        for path in ("/signin", "/runtimes", "/healthz", "/static/console.css"):
            async with http.get(url + path, headers=rebinding(url), allow_redirects=False) as answer:
                assert answer.status == 421, (path, answer.status)
                assert "rebind.example" in await answer.text() and "--allow-host" in await answer.text()
                assert all(name in answer.headers for name in SECURITY_HEADERS)
        port = url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
            async with http.get(url + "/signin", headers={"Host": host}) as answer:
                assert answer.status == 200, host


async def test_a_dns_rebinding_page_cannot_use_a_console_started_with_a_token(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="acme-secrets", agents=[scripted("a", reply("x"))]))
    async with console_for(served.port, token=ACME[1]) as url, person() as http:
        headers = rebinding(url)
        async with http.get(url + "/signin", headers=headers) as form:
            assert form.status == 421
        # Had the form been served, its sign-in (with the console's token) would be refused too.
        async with http.post(url + "/signin", data={"token": ""}, headers=headers, allow_redirects=False) as signed:
            assert signed.status == 421
        async with http.get(url + "/runtimes", headers=headers) as read:
            assert read.status == 421 and "acme-secrets" not in await read.text()


async def test_names_given_with_allow_host_are_served_and_origins_are_checked_against_them(served: Served) -> None:
    async with console_for(served.port, site=Site(allowed_hosts=("console.example",))) as url, person() as http:
        port = url.rsplit(":", 1)[1]
        ours = {"Host": f"console.example:{port}"}
        csrf = await signin_form(http, url, **ours)
        from_elsewhere = await post_signin(http, url, csrf, ACME[1], Origin=f"http://rebind.example:{port}", **ours)
        assert from_elsewhere.status == 403
        signed = await post_signin(http, url, csrf, ACME[1], Origin=f"http://console.example:{port}", **ours)
        assert (signed.status, signed.headers["Location"]) == (303, "/runtimes")
        async with http.get(url + "/signin", headers={"Host": f"console.example.evil:{port}"}) as other:
            assert other.status == 421
