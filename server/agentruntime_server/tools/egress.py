"""The egress policy of the http tools: which addresses a tool call may connect to.

An AgentDef names any URL, so without a policy a caller could aim a tool at the cloud
metadata service or at a neighbour on the private network and read the answer back
through the model. The policy is two lists of networks (AGENTRUNTIME_TOOL_EGRESS_ALLOW,
AGENTRUNTIME_TOOL_EGRESS_DENY): an address is allowed iff the allow list is empty or
holds it, and the deny list does not. It is checked on the *resolved* address of every
call (`PolicyResolver`), because a name that resolved to a public address when the
runtime was created may resolve to a private one later.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ..http_client import Resolver, system_resolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDR strings -> networks; a bare address is its own /32 or /128.

    Raises ValueError naming the first bad entry (host bits set count as bad: a typo
    such as 10.0.0.1/8 should not silently become 10.0.0.0/8)."""
    networks = []
    for entry in entries:
        text = entry.strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not a network in CIDR notation (such as 10.0.0.0/8 or fd00::/8): {exc}") from None
    return tuple(networks)


def parse_address(address: str) -> IPAddress:
    """An address as a resolver or a URL gives it: brackets and an IPv6 zone id (fe80::1%eth0)
    are dropped. Raises ValueError if it is not an IP address."""
    text = address.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]  # the zone id names an interface, not a different address
    return ipaddress.ip_address(text)


class EgressPolicy:
    """allow/deny networks; `check` says whether one address may be reached, and if not why."""

    def __init__(self, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> None:
        self.allow = parse_networks(allow)
        self.deny = parse_networks(deny)

    def check(self, address: str) -> str | None:
        """None if `address` is allowed, else a short reason (it names the address and network).

        An IPv4-mapped IPv6 address (::ffff:169.254.169.254) is the IPv4 address it maps:
        the socket reaches that address, so it is judged as both forms."""
        try:
            ip = parse_address(address)
        except ValueError:
            return f"{address!r} is not an IP address"
        forms: tuple[IPAddress, ...] = (ip,)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            forms = (ip.ipv4_mapped, ip)
        for network in self.deny:
            if any(form in network for form in forms):
                return f"{forms[0]} is in the denied network {network}"
        if self.allow and not any(form in network for form in forms for network in self.allow):
            return f"{forms[0]} is in no allowed network"
        return None


class EgressDenied(OSError):
    """Every address a host name resolved to is denied (raised by PolicyResolver: the client
    reports it as a ConnectFailed whose os_error is this, and connects nowhere)."""

    def __init__(self, host: str, reasons: list[str]) -> None:
        super().__init__(f"{host} resolves only to denied addresses ({'; '.join(reasons)})")
        self.host = host
        self.reasons = reasons


class PolicyResolver:
    """The system resolver with the denied addresses taken out of every answer: the client
    connects only to what is left, so no second lookup can answer differently.

    The client calls it only for host names, never for IP-literal URL hosts: those are
    checked by the caller before the request."""

    def __init__(self, policy: EgressPolicy, inner: Resolver = system_resolver) -> None:
        self._policy = policy
        self._inner = inner

    async def __call__(self, host: str, port: int) -> list[str]:
        addresses = await self._inner(host, port)
        allowed: list[str] = []
        reasons: list[str] = []
        for address in addresses:
            reason = self._policy.check(address)
            if reason is None:
                allowed.append(address)
            elif reason not in reasons:
                reasons.append(reason)
        if addresses and not allowed:
            raise EgressDenied(host, reasons)
        return allowed
