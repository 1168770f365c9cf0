"""The MCP client's connections, under the egress policy with no gap between check and connect.

The SDK's HTTP client (httpx2) resolves the server's name itself when it connects: a check
made before, on an answer of its own, would let a name whose DNS answers an allowed address
to the check and 127.0.0.1 or 169.254.169.254 to the connect (DNS rebinding) through. So
the connection pool's network backend does both: it resolves the name once per connection,
judges every address, and connects to the judged addresses themselves. TLS still verifies
the name (httpcore gives it as the server_hostname, SNI) and the Host header still names it.
Imported with the SDK, when an MCP server is first used."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable

import httpcore2
import httpx2

from ..domain.ports import McpError
from ..http import system_resolver
from .egress import REFUSED, EgressPolicy

log = logging.getLogger(__name__)


class PolicyNetworkBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's default backend, connecting only to addresses the policy allows, and only if
    every address the name resolves to is allowed (the MCP servers' rule)."""

    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = await system_resolver(host, port)
        except OSError as error:
            raise McpError(f"{host} does not resolve ({error.strerror or type(error).__name__})") from None
        for address in addresses:
            reason = self._policy.check(address)
            if reason is not None:
                if addresses == [host]:  # an IP literal: the tenant named the address itself
                    raise McpError(f"{REFUSED}{reason}")
                # What a name resolves to is the server's DNS, not the tenant's to learn.
                log.info("egress: MCP server host %s refused (%s)", host, reason)
                raise McpError(f"{REFUSED}{host} resolves to an address it refuses")
        failure: Exception = McpError(f"{host} does not resolve")
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as error:
                failure = error
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def ssl_context() -> ssl.SSLContext:
    """httpx2's, with trust_env off. Made once and shared: making one reads the system's CA
    bundle, 30-70 ms of CPU (run it off the event loop)."""
    return httpx2.create_ssl_context(trust_env=False)


def policy_transport(policy: EgressPolicy, context: ssl.SSLContext) -> httpx2.AsyncHTTPTransport:
    """httpx2's transport as an AsyncClient would make it with trust_env off (no proxy from the
    environment: a proxy would connect for us, past the policy), over PolicyNetworkBackend."""
    transport = httpx2.AsyncHTTPTransport(verify=context, trust_env=False)
    # httpx2 takes no network backend: its pool is replaced by one like it that has ours
    # (the limits are httpx2's defaults).
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=context,
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=PolicyNetworkBackend(policy),
    )
    return transport
