"""The http tools' egress policy, redirects and body limits (issue 9, item 6).

Everything here stays on loopback: the "forbidden" addresses the server is aimed at are
loopback addresses denied by the test's own settings. Every form of an address, and both
defaults, are in tests/api/test_egress_forms.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import egress_policy
from agentruntime_server.settings import Settings
from agentruntime_server.tools.egress import REFUSED, EgressPolicy, parse_networks
from agentruntime_server.tools.http import MAX_ERROR_BODY
from aiohttp import web

from tests.support.build import agent, create, http_tool, run
from tests.support.dns import REBOUND, RebindingDns
from tests.support.listener import Listener
from tests.support.loopback import Loopback
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.servers import serve
from tests.support.tool_server import ToolServer

LIMIT = 1024  # the servers below run with max_text_bytes at its floor, 1 KiB


# ---- the classification ----


def test_the_local_default_refuses_metadata_and_link_local_and_allows_loopback() -> None:
    policy = egress_policy(Settings(metrics_listen="off", store="memory://"))  # AUTH=none
    link_local = "169.254.169.254 is in 169.254.0.0/16 (link-local), closed unless AGENTRUNTIME_TOOL_EGRESS_ALLOW opens it"
    assert policy.check("169.254.169.254") == link_local
    assert policy.check("[::ffff:a9fe:a9fe]") == f"::ffff:a9fe:a9fe stands for 169.254.169.254: {link_local}"
    assert (policy.check("fd00:ec2::254") or "").startswith("fd00:ec2::254 is in fd00:ec2::254/128 (a cloud metadata address)")
    assert (policy.check("fe80::1%eth0") or "").startswith("fe80::1 is in fe80::/10 (link-local)")
    assert policy.check("100.100.100.200") is not None
    for address in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "10.1.2.3", "fd00::1", "203.0.113.7", "2001:db8::1"):
        assert policy.check(address) is None, address
    assert policy.check("not-an-address") == "'not-an-address' is not an IP address"


def test_an_allow_list_restricts_and_deny_wins() -> None:
    policy = EgressPolicy(allow=["127.0.0.0/8", "::1"], deny=["127.0.0.2/32"], shared=False)
    assert policy.check("127.0.0.1") is None
    assert policy.check("::1") is None
    assert policy.check("::ffff:127.0.0.3") is None
    assert policy.check("10.0.0.1") == "10.0.0.1 is in no allowed network"
    assert policy.check("2001:db8::2") == "2001:db8::2 is in no allowed network"
    assert policy.check("127.0.0.2") == "127.0.0.2 is in the denied network 127.0.0.2/32"
    denied = "127.0.0.2 is in the denied network 127.0.0.2/32"
    assert policy.check("::ffff:127.0.0.2") == f"::ffff:7f00:2 stands for 127.0.0.2: {denied}"


@pytest.mark.parametrize("entry", ["10.0.0.1/8", "10.0.0.0/33", "nonsense", "", "fe80::/129"])
def test_a_bad_network_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="is not a network in CIDR notation"):
        parse_networks(["10.0.0.0/8", entry])
    with pytest.raises(ValueError, match="is not a network in CIDR notation"):
        Settings(metrics_listen="off", store="memory://", tool_egress_deny=[entry])
    with pytest.raises(ValueError, match="is not a network in CIDR notation"):
        Settings(metrics_listen="off", store="memory://", tool_egress_allow=[entry])


# ---- end to end, through a real server ----


@asynccontextmanager
async def serving(model: ScriptedModelServer, **overrides: Any) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    async with serve(
        llm_style="openai",
        llm_base_url=model.base_url,
        llm_api_key="sk-test-secret-never-shown",
        max_text_bytes=LIMIT,
        **overrides,
    ) as served:
        yield served.stub


async def call_tools(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, urls: dict[str, str], runtime_id: str = ""
) -> dict[str, pb.Message]:
    """One agent calls each tool once (all in its first turn); returns each tool's result message.
    `runtime_id`: a runtime defining agent "user" with those tools already (else one is created)."""

    def script(body: dict[str, Any]) -> Reply:
        return Reply(calls=[(name, {"q": name}) for name in urls]) if tool_results(body) == 0 else Reply(text="done")

    model.script("user", script)
    runtime_id = runtime_id or await create(stub, agent("user", tools=[http_tool(name, url) for name, url in urls.items()]))
    handle_id, result = await run(stub, runtime_id, "user", "go")
    assert result.status == pb.STATUS_DONE
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    messages = [m for m in transcript.messages if m.role == "tool"]
    assert len(messages) == len(urls)
    return dict(zip(urls, messages, strict=True))


async def test_a_denied_ip_literal_stored_under_a_looser_policy_is_never_connected_to(
    model: ScriptedModelServer, tmp_path: Path
) -> None:
    # CreateRuntime refuses a denied IP literal (tests/api/test_egress_forms.py); a runtime created
    # before the deny was added still holds one, and its calls are refused before connecting.
    store = f"sqlite:///{tmp_path / 'store.db'}"
    urls = {"plain": "http://127.0.0.2:{port}/x", "mapped": "http://[::ffff:127.0.0.2]:{port}/x"}
    async with Listener("127.0.0.2") as listener:
        async with serving(model, store=store) as stub:
            runtime_id = await create(
                stub, agent("user", tools=[http_tool(name, url.format(port=listener.port)) for name, url in urls.items()])
            )
        async with serving(model, store=store, tool_egress_deny=["127.0.0.2/32"]) as stub:
            results = await call_tools(stub, model, urls, runtime_id)
    assert results["plain"].content == "refused by the egress policy: 127.0.0.2 is in the denied network 127.0.0.2/32"
    assert results["mapped"].content == (
        "refused by the egress policy: ::ffff:7f00:2 stands for 127.0.0.2: 127.0.0.2 is in the denied network 127.0.0.2/32"
    )
    assert all(message.is_error for message in results.values())
    assert listener.accepted == 0


async def test_a_host_name_resolving_only_to_denied_addresses_is_never_connected_to(model: ScriptedModelServer) -> None:
    # localhost resolves (from /etc/hosts, no DNS) to 127.0.0.1 and perhaps ::1: deny both.
    async with Listener("127.0.0.1") as listener, serving(model, tool_egress_deny=["127.0.0.0/8", "::1/128"]) as stub:
        results = await call_tools(stub, model, {"named": f"http://localhost:{listener.port}/"})
    message = results["named"]
    assert message.is_error
    # The addresses a name resolves to are the server's DNS: the log has them, the tenant does not.
    assert message.content == "refused by the egress policy: localhost resolves only to addresses it refuses"
    assert listener.accepted == 0


async def test_a_name_rebound_after_its_check_is_not_connected_to(
    model: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The resolver that judges the addresses hands them to the connector: one answer, judged
    # and connected to (the allowed first answer), never a second.
    dns = RebindingDns(monkeypatch)
    dns.rebind()
    async with (
        Listener("127.0.0.1") as listener,
        Listener("127.0.0.3", listener.port) as allowed,
        serving(model, tool_egress_deny=["127.0.0.1/32"]) as stub,
    ):
        results = await call_tools(stub, model, {"rebound": f"http://{REBOUND}:{listener.port}/"})
    message = results["rebound"]
    # It hangs up on the request unanswered: the call is in doubt, and its resends (RETRY) resolve
    # the name again, to the denied address now, and are refused before connecting.
    assert (message.content, message.is_error) == (
        "no answer in 3 attempts with the same Idempotency-Key (the connection was lost after the request was sent; "
        f"{REFUSED}{REBOUND} resolves only to addresses it refuses): the call may or may not have taken effect",
        True,
    )
    assert (allowed.accepted, listener.accepted) == (1, 0)


async def test_an_allowed_host_name_is_reached_through_the_policy_resolver(model: ScriptedModelServer, tools: ToolServer) -> None:
    async with serving(model, tool_egress_allow=["127.0.0.0/8", "::1/128"]) as stub:
        results = await call_tools(stub, model, {"ping": f"http://localhost:{tools.port}/ping"})
    assert (results["ping"].content, results["ping"].is_error) == ("ping ok #1", False)


class Awkward(Loopback):
    """A tool server that redirects, fails verbosely and answers too much."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{name}", self._hit)

    async def _hit(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.hits[name] += 1
        if name == "redirect":
            raise web.HTTPFound(self.url("target") + "?" + "x" * 400)
        if name == "verbose-error":
            return web.Response(status=500, text="E" * 5000)
        if name == "big":
            return web.Response(text="b" * (LIMIT + 1))
        if name == "exact":
            return web.Response(text="e" * LIMIT)
        if name == "endless":  # chunked, no Content-Length, far more than the limit
            response = web.StreamResponse()
            await response.prepare(request)
            try:
                for _ in range(1000):
                    await response.write(b"s" * 1024)
            except ConnectionError:
                pass  # the reader hung up after LIMIT + 1 bytes
            return response
        return web.Response(text=f"{name} ok")


@pytest.fixture
async def awkward() -> AsyncIterator[Awkward]:
    server = Awkward()
    await server.start()
    yield server
    await server.stop()


async def test_redirects_error_bodies_and_output_limits(model: ScriptedModelServer, awkward: Awkward) -> None:
    names = ["redirect", "verbose-error", "big", "exact", "endless"]
    async with serving(model) as stub:
        results = await call_tools(stub, model, {name.replace("-", "_"): awkward.url(name) for name in names})

    redirect = results["redirect"]
    assert redirect.is_error
    location = (awkward.url("target") + "?" + "x" * 400)[:200]
    assert redirect.content == f"HTTP 302: redirects are not followed (Location: {location})"
    assert awkward.hits["target"] == 0

    verbose = results["verbose_error"]
    assert verbose.is_error
    assert verbose.content == "HTTP 500: " + "E" * MAX_ERROR_BODY
    assert MAX_ERROR_BODY == 500

    too_large = f"HTTP 200: the output exceeds the limit of {LIMIT} bytes (AGENTRUNTIME_MAX_TEXT_BYTES)"
    assert (results["big"].content, results["big"].is_error) == (too_large, True)
    assert (results["endless"].content, results["endless"].is_error) == (too_large, True)
    assert (results["exact"].content, results["exact"].is_error) == ("e" * LIMIT, False)
