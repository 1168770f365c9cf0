"""Issue 27, items 1-3: the egress policy judges an address in every form it can be written in,
a shared server (authentication on) keeps its own network closed, the unspecified address is
refused always, and a tenant cannot tell a closed port from one that answers nonsense.

The end-to-end tests aim real servers at loopback listeners on 127.0.0.1, .2, .3 and ::1 (one
port for all) that count every connection: a refused form must reach none of them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.domain.ports import McpError
from agentruntime_server.tools.egress import EgressDenied, EgressPolicy, PolicyResolver, host_address
from agentruntime_server.tools.http import UNREACHABLE
from agentruntime_server.tools.mcp_network import PolicyNetworkBackend
from aiohttp import web

from tests.support.build import agent, create, duration, http_tool, run, status_details, transcript
from tests.support.listener import Listener
from tests.support.loopback import Loopback
from tests.support.mcp import Calc
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.servers import Served, serve
from tests.support.tenants import DEFAULT, Caller, tenant_server

REFUSED = "refused by the egress policy: "
# An http tool call to a listener that reads the request and hangs up, under RETRY (tools.md).
IN_DOUBT = (
    "no answer in 3 attempts with the same Idempotency-Key (the connection was lost after the request was sent): "
    "the call may or may not have taken effect"
)
NOT_MCP = "it could not be reached or did not answer as an MCP server"
CLOSED = "closed unless AGENTRUNTIME_TOOL_EGRESS_ALLOW opens it"
NEVER = "which is never reached"

# ---- every form a URL host can name an address in ----

# (host as a URL writes it, the address a URL parser or getaddrinfo reads it as)
IPV4_FORMS = [
    ("127.0.0.3", "127.0.0.3"),
    ("2130706435", "127.0.0.3"),  # decimal
    ("0x7f000003", "127.0.0.3"),  # hex
    ("0177.0.0.3", "127.0.0.3"),  # octal
    ("0x7f.3", "127.0.0.3"),  # short, hex
    ("127.3", "127.0.0.3"),  # short
    ("127.0.0.3.", "127.0.0.3"),  # trailing dot
    ("0x7f.0.0.3.", "127.0.0.3"),
    ("0", "0.0.0.0"),
    ("0x0", "0.0.0.0"),
    ("00", "0.0.0.0"),
    ("0.0.0.0", "0.0.0.0"),
]
IPV6_FORMS = [
    ("[::ffff:127.0.0.3]", "::ffff:7f00:3"),  # IPv4-mapped
    ("[::127.0.0.3]", "::7f00:3"),  # IPv4-compatible
    ("[fe80::1%25eth0]", "fe80::1"),  # a zone id names an interface, not another address
    ("[::]", "::"),
]


@pytest.mark.parametrize(("host", "address"), IPV4_FORMS + IPV6_FORMS)
def test_a_url_host_is_read_as_the_address_it_names(host: str, address: str) -> None:
    assert str(host_address(host.strip("[]").replace("%25", "%"))) == address


@pytest.mark.parametrize("host", ["example.com", "localhost", "a0x7f.3", "0x7f.example", "1.2.3.4.5", "0x"])
def test_a_host_name_is_left_to_the_resolver(host: str) -> None:
    assert host_address(host) is None


@pytest.mark.parametrize("host", ["256.0.0.1", "99999999999", "0x1ffffffff", "08.0.0.1", "1.2.3.256", "127.0.0.1 x"])
def test_a_number_that_is_no_address_is_refused(host: str) -> None:
    if " " in host:  # inet_aton would take it (trailing garbage): it never reaches inet_aton
        assert host_address(host) is None
        return
    with pytest.raises(ValueError, match="reads as an IPv4 address but is not one"):
        host_address(host)


# ---- the policy on every form of every range ----

SHARED = EgressPolicy()  # authentication on
LOCAL = EgressPolicy(shared=False)  # AUTH=none

# (address, what a shared server says, what a local one says: None allows, else a part of the reason)
VERDICTS: list[tuple[str, str | None, str | None]] = [
    ("8.8.8.8", None, None),
    ("2001:4860:4860::8888", None, None),
    ("::ffff:8.8.8.8", None, None),
    ("64:ff9b::8.8.8.8", None, None),
    ("2002:808:808::1", None, None),  # 6to4 of a public address
    # the unspecified address: refused by both
    ("0.0.0.0", NEVER, NEVER),
    ("0.1.2.3", NEVER, NEVER),
    ("::", NEVER, NEVER),
    ("::ffff:0.0.0.0", "::ffff:0:0 stands for 0.0.0.0", "::ffff:0:0 stands for 0.0.0.0"),
    ("64:ff9b::", "stands for 0.0.0.0", "stands for 0.0.0.0"),
    ("2002::1", "stands for 0.0.0.0", "stands for 0.0.0.0"),
    # loopback and private: refused by a shared server only
    ("127.0.0.1", "in 127.0.0.0/8 (loopback)", None),
    ("127.255.255.254", "in 127.0.0.0/8 (loopback)", None),
    ("::1", "in ::1/128 (loopback)", None),
    ("::ffff:127.0.0.3", "::ffff:7f00:3 stands for 127.0.0.3: 127.0.0.3 is in 127.0.0.0/8 (loopback)", None),
    ("::127.0.0.3", "::7f00:3 stands for 127.0.0.3", None),  # IPv4-compatible
    ("64:ff9b::7f00:3", "64:ff9b::7f00:3 stands for 127.0.0.3", None),  # NAT64
    ("64:ff9b:1::7f00:3", "in 64:ff9b:1::/48 (local-use NAT64)", None),
    ("64:ff9b:1:7f00:0:300::", "in 64:ff9b:1::/48 (local-use NAT64)", None),  # its /48 layout
    ("2002:7f00:3::1", "2002:7f00:3::1 stands for 127.0.0.3", None),  # 6to4
    ("2001:0:4136:e378:8000:63bf:80ff:fffc", "stands for 127.0.0.3", None),  # Teredo, client 127.0.0.3
    ("10.1.2.3", "in 10.0.0.0/8 (private)", None),
    ("172.31.255.255", "in 172.16.0.0/12 (private)", None),
    ("192.168.0.1", "in 192.168.0.0/16 (private)", None),
    ("::ffff:192.168.0.1", "stands for 192.168.0.1", None),
    ("64:ff9b::a00:1", "stands for 10.0.0.1", None),
    ("100.64.0.1", "in 100.64.0.0/10 (shared address space (CGNAT))", None),
    ("fd12:3456::1", "in fc00::/7 (unique-local)", None),
    ("fec0::1", "in fec0::/10 (site-local)", None),
    ("198.18.0.1", "in 198.18.0.0/15 (benchmarking)", None),
    ("192.0.2.1", "in 192.0.2.0/24 (documentation)", None),
    ("2001:db8::1", "in 2001:db8::/32 (documentation)", None),
    ("224.0.0.1", "in 224.0.0.0/4 (multicast)", None),
    ("ff02::1", "in ff00::/8 (multicast)", None),
    ("240.0.0.1", "in 240.0.0.0/4 (reserved (and broadcast))", None),
    ("255.255.255.255", "in 240.0.0.0/4", None),
    # link-local and metadata: refused by both
    ("169.254.169.254", "in 169.254.0.0/16 (link-local)", "in 169.254.0.0/16 (link-local)"),
    ("::ffff:169.254.169.254", "stands for 169.254.169.254", "stands for 169.254.169.254"),
    ("64:ff9b::a9fe:a9fe", "stands for 169.254.169.254", "stands for 169.254.169.254"),
    ("64:ff9b:1::a9fe:a9fe", "(local-use NAT64)", "stands for 169.254.169.254"),
    ("64:ff9b:1:a9fe:a9:fe00::", "(local-use NAT64)", "stands for 169.254.169.254"),
    ("2002:a9fe:a9fe::1", "stands for 169.254.169.254", "stands for 169.254.169.254"),
    ("fe80::1%eth0", "in fe80::/10 (link-local)", "in fe80::/10 (link-local)"),
    ("fd00:ec2::254", "in fd00:ec2::254/128 (a cloud metadata address)", "a cloud metadata address"),
    ("100.100.100.200", "in 100.100.100.200/32 (a cloud metadata address)", "a cloud metadata address"),
]


@pytest.mark.parametrize(("address", "shared", "local"), VERDICTS)
def test_every_form_of_every_range_is_judged(address: str, shared: str | None, local: str | None) -> None:
    for policy, expected in ((SHARED, shared), (LOCAL, local)):
        verdict = policy.check(address)
        if expected is None:
            assert verdict is None, (policy.shared, verdict)
        else:
            assert verdict is not None and expected in verdict, (policy.shared, verdict)


def test_only_an_allow_entry_inside_a_protected_range_opens_it() -> None:
    policy = EgressPolicy(allow=["127.0.0.2/32", "10.1.2.0/24", "fc00::/7", "100.64.0.0/10", "0.0.0.0/0", "::/0"])
    for address in ("127.0.0.2", "::ffff:127.0.0.2", "10.1.2.3", "fd00::1", "100.64.0.1", "8.8.8.8", "2001:4860::1"):
        assert policy.check(address) is None, address
    # 0.0.0.0/0 and ::/0 hold these, but lie inside no protected range: they stay closed.
    for address in ("127.0.0.3", "10.1.3.1", "192.168.0.1", "::1", "169.254.169.254"):
        assert CLOSED in (policy.check(address) or ""), address
    # The narrowest protected range must hold the entry: fc00::/7 and 100.64.0.0/10 do not open
    # the metadata addresses inside them.
    assert "(a cloud metadata address)" in (policy.check("fd00:ec2::254") or "")
    assert "(a cloud metadata address)" in (policy.check("100.100.100.200") or "")
    assert EgressPolicy(allow=["169.254.169.254/32"]).check("169.254.169.254") is None
    # An explicit deny wins over every entry; the unspecified address opens for none.
    assert "denied network" in (EgressPolicy(allow=["127.0.0.0/8"], deny=["127.0.0.2/32"]).check("127.0.0.2") or "")
    assert NEVER in (EgressPolicy(allow=["0.0.0.0/8", "::/128"], shared=False).check("0.0.0.0") or "")
    assert NEVER in (EgressPolicy(allow=["0.0.0.0/8", "::/128"], shared=False).check("::") or "")
    # A non-empty ALLOW admits only what it holds, in either mode.
    assert EgressPolicy(allow=["127.0.0.0/8"], shared=False).check("8.8.8.8") == "8.8.8.8 is in no allowed network"


async def test_numeric_host_names_are_judged_on_the_address_they_resolve_to() -> None:
    # The http client and the MCP transport hand a host that is no canonical IP literal to the
    # resolver: getaddrinfo reads 2130706435 and 0x7f.3 as 127.0.0.3, and that is what is judged.
    resolver = PolicyResolver(SHARED)
    for host in ("2130706435", "0x7f.3", "localhost"):
        with pytest.raises(EgressDenied, match=f"^{host} resolves only to addresses it refuses$"):
            await resolver(host, 80)
    assert await PolicyResolver(LOCAL)("2130706435", 80) == ["127.0.0.3"]
    async with Listener("127.0.0.3") as listener:
        backend = PolicyNetworkBackend(SHARED)
        for host in ("2130706435", "0x7f.3", "127.0.0.3"):
            with pytest.raises(McpError, match=f"^{REFUSED}"):
                await backend.connect_tcp(host, listener.port)
        stream = await PolicyNetworkBackend(LOCAL).connect_tcp("2130706435", listener.port)
        await stream.aclose()
        await until(lambda: listener.accepted == 1, "the local policy's connection")


# ---- end to end: CreateRuntime refuses every form before anything connects ----


class Listeners:
    """Counting listeners on 127.0.0.1, 127.0.0.2, 127.0.0.3 and ::1, all on one port."""

    HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "::1")

    def __init__(self) -> None:
        self.port = 0
        self.all: list[Listener] = []

    @property
    def accepted(self) -> dict[str, int]:
        return {listener.host: listener.accepted for listener in self.all}


@contextlib.asynccontextmanager
async def listeners() -> AsyncIterator[Listeners]:
    for _ in range(20):  # another process may hold the port on one of the addresses
        made = Listeners()
        async with contextlib.AsyncExitStack() as stack:
            try:
                first = await stack.enter_async_context(Listener("127.0.0.1"))
                made.port = first.port
                made.all = [first] + [await stack.enter_async_context(Listener(h, first.port)) for h in Listeners.HOSTS[1:]]
            except OSError:
                continue
            yield made
            return
    raise AssertionError("no port free on every loopback address")


# (host, the field's description must hold this): every form of 127.0.0.3, loopback, private,
# link-local and metadata, refused by a shared server.
SHARED_REFUSED = [
    *((host, f"{address} is in 127.0.0.0/8 (loopback)") for host, address in IPV4_FORMS if address == "127.0.0.3"),
    ("[::ffff:127.0.0.3]", "stands for 127.0.0.3"),
    ("[::ffff:7f00:3]", "stands for 127.0.0.3"),
    ("[::127.0.0.3]", "stands for 127.0.0.3"),
    ("[64:ff9b::127.0.0.3]", "stands for 127.0.0.3"),
    ("[64:ff9b:1::7f00:3]", "64:ff9b:1::/48 (local-use NAT64)"),
    ("[2002:7f00:3::1]", "stands for 127.0.0.3"),
    ("[2001:0:4136:e378:8000:63bf:80ff:fffc]", "stands for 127.0.0.3"),  # Teredo
    ("127.0.0.2", "127.0.0.2 is in 127.0.0.0/8 (loopback)"),
    ("[::1]", "::1 is in ::1/128 (loopback)"),
    ("10.0.0.1", "(private)"),
    ("172.16.0.1", "(private)"),
    ("192.168.1.1", "(private)"),
    ("100.64.0.1", "(CGNAT)"),
    ("[fd00::1]", "(unique-local)"),
    ("169.254.169.254", "(link-local)"),
    ("[fe80::1%25lo]", "(link-local)"),
    ("[fd00:ec2::254]", "(a cloud metadata address)"),
    ("100.100.100.200", "(a cloud metadata address)"),
]
UNSPECIFIED = [
    ("0.0.0.0", NEVER),
    ("0", NEVER),
    ("0x0", NEVER),
    ("0.0", NEVER),
    ("[::]", NEVER),
    ("[::ffff:0.0.0.0]", NEVER),
]
USERINFO = [("x@127.0.0.3", "must not carry credentials"), ("x:y@0x7f.3", "must not carry credentials")]


async def refusals(create_runtime: Any, hosts: list[tuple[str, str]], port: int) -> None:
    """Each host, as an http tool's URL and as an MCP server's, is refused by CreateRuntime:
    INVALID_ARGUMENT naming the url field, with the policy's reason."""
    for host, says in hosts:
        for definition, field in (
            (agent("user", tools=[http_tool("probe", f"http://{host}:{port}/x")]), "agents[0].tools[0].http.url"),
            (
                agent("user", mcp_servers=[pb.McpServer(name="probe", url=f"http://{host}:{port}/mcp")]),
                "agents[0].mcp_servers[0].url",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await create_runtime(pb.CreateRuntimeRequest(agents=[definition]))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (host, refused.value.details())
            [bad_request] = status_details(refused.value)
            [violation] = bad_request.field_violations
            assert violation.field == field, (host, violation)
            assert says in violation.description, (host, violation.description)
            if "credentials" not in says:
                assert violation.description.startswith(REFUSED), (host, violation.description)


async def test_a_shared_server_refuses_every_form_of_its_own_network_at_create_runtime(tmp_path: Path) -> None:
    async with listeners() as targets, tenant_server(tmp_path) as served:
        tenant = Caller(served.stub, DEFAULT)
        await refusals(lambda request: tenant("CreateRuntime", request), SHARED_REFUSED + UNSPECIFIED + USERINFO, targets.port)
        assert not (await tenant("ListRuntimes", pb.ListRuntimesRequest())).runtimes
    assert targets.accepted == dict.fromkeys(Listeners.HOSTS, 0)


@pytest.mark.parametrize("deny", [[], ["127.0.0.0/8", "::1/128"]])
async def test_the_unspecified_address_is_refused_without_authentication_too(deny: list[str]) -> None:
    async with listeners() as targets, serve(tool_egress_deny=deny) as served:
        await refusals(served.stub.CreateRuntime, UNSPECIFIED, targets.port)
    assert targets.accepted == dict.fromkeys(Listeners.HOSTS, 0)


async def test_a_shared_server_refuses_a_name_resolving_to_its_network_when_it_connects(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    async with listeners() as targets, tenant_server(tmp_path, **scripted(model)) as served:
        tenant = Caller(served.stub, DEFAULT)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            mcp = pb.McpServer(name="probe", url=f"http://localhost:{targets.port}/mcp")
            await tenant("CreateRuntime", pb.CreateRuntimeRequest(agents=[agent("user", mcp_servers=[mcp])]))
        assert refused.value.details() == (
            "agents[0].mcp_servers[0]: MCP server 'probe' could not be listed: "
            f"{REFUSED}localhost resolves to an address it refuses"
        )
        model.script("user", calls_each(["probe"]))
        tool = http_tool("probe", f"http://localhost:{targets.port}/x")
        created = await tenant("CreateRuntime", pb.CreateRuntimeRequest(agents=[agent("user", tools=[tool])]))
        [message] = await tool_messages(tenant, created.runtime_id)
        assert (message.content, message.is_error) == (f"{REFUSED}localhost resolves only to addresses it refuses", True)
    assert targets.accepted == dict.fromkeys(Listeners.HOSTS, 0)


async def test_allow_opens_a_protected_range_only_with_an_entry_inside_it(tmp_path: Path, model: ScriptedModelServer) -> None:
    allow = ["127.0.0.2/32", "0.0.0.0/0", "::/0"]
    async with listeners() as targets, tenant_server(tmp_path, tool_egress_allow=allow, **scripted(model)) as served:
        tenant = Caller(served.stub, DEFAULT)
        refused = [("127.0.0.3", "127.0.0.3 is in 127.0.0.0/8"), ("2130706435", "127.0.0.3 is in"), ("[::1]", "(loopback)")]
        await refusals(lambda request: tenant("CreateRuntime", request), refused, targets.port)
        model.script("user", calls_each(["opened"]))
        tool = http_tool("opened", f"http://127.0.0.2:{targets.port}/x")
        created = await tenant("CreateRuntime", pb.CreateRuntimeRequest(agents=[agent("user", tools=[tool])]))
        [message] = await tool_messages(tenant, created.runtime_id)
        assert (message.content, message.is_error) == (IN_DOUBT, True)  # the listener hangs up on the request
    assert targets.accepted == {"127.0.0.1": 0, "127.0.0.2": 3, "127.0.0.3": 0, "::1": 0}  # sent, then resent twice


async def test_a_runtime_stored_under_a_looser_policy_connects_nowhere_the_shared_server_refuses(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    """Created on a local server (loopback open), then served with authentication: its stored
    http tool and MCP server on 127.0.0.2 are refused at every call, before connecting."""
    calc = Calc("127.0.0.2")
    await calc.start()
    try:
        async with listeners() as targets:
            store = f"sqlite:///{tmp_path / 'store.db'}"
            tools = [http_tool("web", f"http://127.0.0.2:{targets.port}/x")]
            user = agent("user", tools=tools, mcp_servers=[pb.McpServer(name="calc", url=calc.url)])
            async with serve(store=store, **scripted(model)) as served:
                runtime_id = await create(served.stub, user)
            listed = calc.requests
            model.script("user", calls_each(["web", "calc__add"], {"a": 1, "b": 2}))
            async with tenant_server(tmp_path, **scripted(model)) as served:
                results = await tool_messages(Caller(served.stub, DEFAULT), runtime_id)
        by_text = sorted((message.content, message.is_error) for message in results)
        assert by_text == [
            (f"MCP server 'calc': {REFUSED}127.0.0.2 is in 127.0.0.0/8 (loopback), {CLOSED}", True),
            (f"{REFUSED}127.0.0.2 is in 127.0.0.0/8 (loopback), {CLOSED}", True),
        ]
        assert targets.accepted == dict.fromkeys(Listeners.HOSTS, 0)
        assert calc.requests == listed
    finally:
        await calc.stop()


# ---- a closed port and an open one answer alike ----


class NotMcp(Loopback):
    """An HTTP server that is no MCP server: an HTML page, or a 404."""

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/html", self._html)
        app.router.add_route("*", "/json", self._json)

    async def _html(self, request: web.Request) -> web.Response:
        return web.Response(text="<html>admin</html>", content_type="text/html")

    async def _json(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})


@contextlib.asynccontextmanager
async def raw(answer: bytes | None, port: int = 0) -> AsyncIterator[int]:
    """A TCP listener that writes `answer` and hangs up (None: says nothing, never hangs up)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if answer is None:
            held.append(writer)
            return
        with contextlib.suppress(ConnectionError):
            await reader.read(1)
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", port)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens here once the socket closes


@contextlib.asynccontextmanager
async def endpoints(served: Served) -> AsyncIterator[dict[str, str]]:
    """Base URLs of everything a tenant might probe: nothing, a hang-up, an SSH banner, an HTTP
    server that is not MCP, the agentruntime server's own gRPC port, a listener that never answers."""
    site = NotMcp()
    await site.start()
    try:
        async with raw(b"") as hangs_up, raw(b"SSH-2.0-OpenSSH_9.6\r\n") as ssh, raw(None) as silent:
            yield {
                "closed": f"http://127.0.0.1:{closed_port()}/mcp",
                "hangs_up": f"http://127.0.0.1:{hangs_up}/mcp",
                "ssh": f"http://127.0.0.1:{ssh}/mcp",
                "html": f"http://127.0.0.1:{site.port}/html",
                "json": f"http://127.0.0.1:{site.port}/json",
                "not_found": f"http://127.0.0.1:{site.port}/nothing",
                "grpc": f"http://127.0.0.1:{served.port}/mcp",
                "silent": f"http://127.0.0.1:{silent}/mcp",
            }
    finally:
        await site.stop()


async def test_an_mcp_server_that_cannot_be_reached_and_one_that_is_no_mcp_server_read_the_same() -> None:
    async with serve() as served, endpoints(served) as urls:
        said = {}
        for name, url in urls.items():
            server = pb.McpServer(name="probe", url=url, timeout=duration(1))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await create(served.stub, agent("user", mcp_servers=[server]))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            said[name] = refused.value.details()
    assert said == dict.fromkeys(urls, f"agents[0].mcp_servers[0]: MCP server 'probe' could not be listed: {NOT_MCP}")


async def test_an_mcp_call_to_a_closed_port_and_to_a_listener_speaking_nonsense_read_the_same(model: ScriptedModelServer) -> None:
    calc = Calc()
    await calc.start()
    async with serve(**scripted(model)) as served:
        runtime_id = await create(served.stub, agent("user", mcp_servers=[pb.McpServer(name="calc", url=calc.url)]))
        await calc.stop()
        model.script("user", calls_each(["calc__add"], {"a": 1, "b": 2}))
        gone = await tool_messages(served.stub, runtime_id)
        async with raw(b"SSH-2.0-OpenSSH_9.6\r\n", calc.port):  # something else on the port calc left
            nonsense = await tool_messages(served.stub, runtime_id)
    expected = f"MCP server 'calc' failed: {NOT_MCP}"
    assert [(m.content, m.is_error) for m in gone + nonsense] == [(expected, True)] * 2


async def test_an_http_tool_to_a_closed_port_and_to_a_listener_speaking_nonsense_read_the_same(
    model: ScriptedModelServer,
) -> None:
    """But a listener that takes the request and hangs up is told apart: it may be a tool server
    that died with the call, which may have taken effect (the call is in doubt: it is resent)."""
    async with serve(**scripted(model)) as served, endpoints(served) as urls:
        names = ["closed", "ssh", "grpc", "hangs_up"]
        model.script("user", calls_each(names))
        tools = [http_tool(name, urls[name]) for name in names]
        runtime_id = await create(served.stub, agent("user", tools=tools))
        results = await tool_messages(served.stub, runtime_id)
    assert [(m.content, m.is_error) for m in results] == [(UNREACHABLE, True)] * 3 + [(IN_DOUBT, True)]


# ---- helpers ----


def scripted(model: ScriptedModelServer) -> dict[str, Any]:
    return {"llm_style": "openai", "llm_base_url": model.base_url, "llm_api_key": "sk-test"}


def calls_each(tools: list[str], arguments: dict[str, Any] | None = None) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[(name, arguments or {"q": name}) for name in tools])
        return Reply(text="done")

    return script


async def tool_messages(stub: Any, runtime_id: str) -> list[pb.Message]:
    """Agent "user" of the runtime runs once; its tool results, in call order. `stub` is a
    stub or a tenant's Caller."""
    if isinstance(stub, Caller):
        handle_id, result = await stub.run(runtime_id, "user", "go")
        reply = await stub("GetTranscript", pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
        messages = list(reply.messages)
    else:
        handle_id, result = await run(stub, runtime_id, "user", "go")
        messages = await transcript(stub, runtime_id, handle_id)
    assert result.status == pb.STATUS_DONE, result
    return [message for message in messages if message.role == "tool"]


async def test_the_start_up_log_says_which_default_applies(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agentruntime")
    async with serve():
        pass
    async with tenant_server(tmp_path, tool_egress_allow=["10.1.2.0/24"]):
        pass
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("egress policy: ")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("egress policy: local default (AGENTRUNTIME_AUTH=none): loopback and private ranges are open;")
    assert lines[1].startswith("egress policy: shared-server default (authentication is on): loopback, private, CGNAT,")
    assert lines[1].endswith("; allow: 10.1.2.0/24; deny: none")
