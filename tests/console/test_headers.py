"""The console's security headers on every response (pages, errors, 404s, static files and the
live event stream, whose headers go out before its first event), over plain HTTP."""

from __future__ import annotations

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.console_http import SECURITY_HEADERS, console_for, person, served, sign_in
from tests.support.servers import Served
from tests.support.tenants import ACME, Caller, reply, scripted

__all__ = ["served"]  # the fixture of tests/support/console_http, used here


async def test_every_response_carries_the_security_headers_the_live_stream_too(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="headed", agents=[scripted("a", reply("x"))]))
    async with console_for(served.port) as url, person() as http:
        await sign_in(http, url, ACME[1])
        for path, status in (
            ("/runtimes/headed/live", 200),
            ("/runtimes/headed", 200),
            ("/no/such/page", 404),
            ("/runtimes/never-was", 404),
            ("/static/console.js", 200),
            ("/signin?x=1", 303),
        ):
            async with http.get(url + path, allow_redirects=False) as answer:
                assert answer.status == status, (path, answer.status)
                missing = [name for name in SECURITY_HEADERS if name not in answer.headers]
                assert not missing, (path, missing)
                if path.endswith("/live"):
                    assert answer.headers["Content-Type"] == "text/event-stream"
                    assert answer.headers["Content-Security-Policy"].startswith("default-src 'none'")
