"""The egress policy: which addresses an http tool or an MCP server may be reached at.

An AgentDef names any URL, so without a policy a tenant could aim a tool at the server's
own ports, at a neighbour on the private network or at the cloud metadata service, and read
the answer back through the model. The policy has three layers:

- the unspecified address (0.0.0.0/8, ::/128: a connect to it reaches the host itself) is
  refused always;
- built-in protected ranges are refused unless ALLOW opens them, and only an ALLOW entry
  lying inside the narrowest protected range holding an address opens it (127.0.0.1/32 or
  10.1.2.0/24 do; 0.0.0.0/0 does not). With authentication on (a shared server) they are
  SHARED_SERVER_PROTECTED: loopback, private, CGNAT, unique-local, link-local, metadata and
  the other special ranges no tool has business with; with AUTH=none (one trusted caller on
  loopback) only LINK_LOCAL_AND_METADATA, so that local tools and tests keep working;
- the operator's lists: DENY always wins; a non-empty ALLOW admits only what it holds.

An IPv6 address that carries an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo) is
judged as each address it carries too: refused if any form is. The check runs on the
*resolved* address of every connection (`PolicyResolver`, and `mcp_network` for MCP),
because a name may resolve to a public address when the runtime is created and to a private
one later; an IP-literal URL host, in any form a URL parser or getaddrinfo reads as an
address (2130706435, 0x7f.3, 0177.0.0.1, 127.1, a trailing dot), is judged before that, at
CreateRuntime (`url_refusal`).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from ..http import Resolver, system_resolver

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# How every refusal a tenant sees starts.
REFUSED = "refused by the egress policy: "

UNSPECIFIED = ("0.0.0.0/8", "::/128")
LINK_LOCAL_AND_METADATA = {
    "169.254.0.0/16": "link-local",
    "fe80::/10": "link-local",
    "fd00:ec2::254/128": "a cloud metadata address",
    "100.100.100.200/32": "a cloud metadata address",
}
SHARED_SERVER_PROTECTED = {
    **LINK_LOCAL_AND_METADATA,
    "127.0.0.0/8": "loopback",
    "::1/128": "loopback",
    "10.0.0.0/8": "private",
    "172.16.0.0/12": "private",
    "192.168.0.0/16": "private",
    "100.64.0.0/10": "shared address space (CGNAT)",
    "fc00::/7": "unique-local",
    "fec0::/10": "site-local",
    "192.0.0.0/24": "IETF protocol assignments",
    "192.0.2.0/24": "documentation",
    "198.51.100.0/24": "documentation",
    "203.0.113.0/24": "documentation",
    "2001:db8::/32": "documentation",
    "3fff::/20": "documentation",
    "198.18.0.0/15": "benchmarking",
    "2001:2::/48": "benchmarking",
    "100::/64": "discard-only",
    "64:ff9b:1::/48": "local-use NAT64",
    "224.0.0.0/4": "multicast",
    "ff00::/8": "multicast",
    "240.0.0.0/4": "reserved (and broadcast)",
}

_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d, deprecated; :: and ::1 are not IPv4
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
# What getaddrinfo and a WHATWG URL parser read as an IPv4 address: one to four dotted parts,
# each decimal, octal (a leading 0) or hex (0x), and one trailing dot. Only such a host is
# handed to inet_aton, which would also take trailing garbage after a space.
_NUMERIC_HOST = re.compile(r"(?:0[xX][0-9a-fA-F]+|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]+|[0-9]+)){0,3}\.?")


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


def host_address(host: str) -> IPAddress | None:
    """The address a URL's host names if it is an IP literal in any form a URL parser or the
    system resolver takes (2130706435, 0x7f000001, 0177.0.0.1, 0x7f.3, 127.1, 0, a trailing
    dot, [::ffff:127.0.0.3]); None for a host name. Raises ValueError for a host that reads
    as a number but is no address (256.0.0.1, 99999999999): URL parsers refuse those."""
    text = host.strip()
    if ":" in text or text.startswith("["):
        return parse_address(text)
    if _NUMERIC_HOST.fullmatch(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text.removesuffix(".")))
        except OSError:
            raise ValueError(f"{host} reads as an IPv4 address but is not one") from None
    return None


def embedded_forms(ip: IPAddress) -> tuple[IPAddress, ...]:
    """The address and every IPv4 address an IPv6 one carries (a socket or a relay reaches
    that one): IPv4-mapped, IPv4-compatible, NAT64 (64:ff9b::/96; 64:ff9b:1::/48 read in its
    /96 layout, or its /48 one when the last 40 bits are zero), 6to4 and Teredo (its server and
    client)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return (ip,)
    forms: list[IPAddress] = [ip]
    value = int(ip)
    if ip.ipv4_mapped is not None:
        forms.append(ip.ipv4_mapped)
    elif ip in _COMPATIBLE and value > 1:
        forms.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
    elif ip in _NAT64:
        forms.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
    elif ip in _NAT64_LOCAL:
        if value & (1 << 40) - 1:  # the usual /96 layout: the address in the last 32 bits
            forms.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
        else:  # RFC 6052's /48 layout (its suffix is zero): 16 bits after the prefix, the 'u' octet, 16 more
            forms.append(ipaddress.IPv4Address(((value >> 64) & 0xFFFF) << 16 | (value >> 40) & 0xFFFF))
    if ip.sixtofour is not None:
        forms.append(ip.sixtofour)
    if ip.teredo is not None:
        forms.extend(ip.teredo)
    return tuple(forms)


class EgressPolicy:
    """The policy one server applies to every connection a definition makes it open.
    `shared`: authentication is on (SHARED_SERVER_PROTECTED) or not (LINK_LOCAL_AND_METADATA)."""

    def __init__(self, allow: Iterable[str] = (), deny: Iterable[str] = (), *, shared: bool = True) -> None:
        self.allow = parse_networks(allow)
        self.deny = parse_networks(deny)
        self.shared = shared
        protected = SHARED_SERVER_PROTECTED if shared else LINK_LOCAL_AND_METADATA
        self._unspecified = parse_networks(UNSPECIFIED)
        # Narrowest first: the first range holding an address is the one ALLOW must lie in.
        ranges = zip(parse_networks(protected), protected.values(), strict=True)
        self._protected = sorted(ranges, key=lambda entry: -entry[0].prefixlen)

    def describe(self) -> str:
        """One line for the start-up log: which default applies, and the operator's lists."""
        if self.shared:
            default = (
                "shared-server default (authentication is on): loopback, private, CGNAT, unique-local, link-local, "
                "metadata and other special ranges are refused unless AGENTRUNTIME_TOOL_EGRESS_ALLOW opens them"
            )
        else:
            default = (
                "local default (AGENTRUNTIME_AUTH=none): loopback and private ranges are open; link-local and "
                "metadata are refused unless AGENTRUNTIME_TOOL_EGRESS_ALLOW opens them"
            )
        allow = ", ".join(map(str, self.allow)) or "any address not refused"
        deny = ", ".join(map(str, self.deny)) or "none"
        return f"egress policy: {default}; the unspecified address is always refused; allow: {allow}; deny: {deny}"

    def check(self, address: str) -> str | None:
        """None if `address` may be connected to, else a short reason naming the address and why."""
        try:
            ip = parse_address(address)
        except ValueError:
            return f"{address!r} is not an IP address"
        return self.judge(ip)

    def judge(self, ip: IPAddress) -> str | None:
        forms = embedded_forms(ip)
        for form in forms:
            reason = self._judge_form(form)
            if reason is not None:
                return reason if form is ip else f"{ip} stands for {form}: {reason}"
        if self.allow and not any(form in network for form in forms for network in self.allow):
            return f"{ip} is in no allowed network"
        return None

    def _judge_form(self, ip: IPAddress) -> str | None:
        for network in self._unspecified:
            if ip in network:
                return f"{ip} is the unspecified address ({network}), which is never reached"
        for network in self.deny:
            if ip in network:
                return f"{ip} is in the denied network {network}"
        for protected, name in self._protected:
            if ip in protected:
                if any(ip in entry and _inside(entry, protected) for entry in self.allow):
                    return None
                return f"{ip} is in {protected} ({name}), closed unless AGENTRUNTIME_TOOL_EGRESS_ALLOW opens it"
        return None

    def url_refusal(self, url: str) -> str | None:
        """Why no connection may be made to `url` whatever DNS says (its host is an IP literal
        the policy refuses, in any form), or None; a host name is judged when it is resolved.
        The message starts with REFUSED."""
        try:
            host = urlsplit(url).hostname
        except ValueError:
            return None  # not a URL: its own check says so
        if not host:
            return None
        try:
            ip = host_address(host)
        except ValueError as exc:
            return f"{REFUSED}{exc}"
        if ip is None:
            return None
        reason = self.judge(ip)
        if reason is None:
            return None
        named = f"the host {host} is {ip}: " if ":" not in host and host != str(ip) else ""
        return f"{REFUSED}{named}{reason}"


def _inside(entry: IPNetwork, protected: IPNetwork) -> bool:
    if isinstance(entry, ipaddress.IPv4Network) and isinstance(protected, ipaddress.IPv4Network):
        return entry.subnet_of(protected)
    if isinstance(entry, ipaddress.IPv6Network) and isinstance(protected, ipaddress.IPv6Network):
        return entry.subnet_of(protected)
    return False


class EgressDenied(OSError):
    """Every address a host name resolved to is refused (raised by PolicyResolver: the client
    reports it as a ConnectFailed whose os_error is this, and connects nowhere). The message
    names the host, not the addresses: a tenant learns nothing of the server's DNS; the
    reasons are logged for the operator."""

    def __init__(self, host: str, reasons: list[str]) -> None:
        super().__init__(f"{host} resolves only to addresses it refuses")
        self.host = host
        self.reasons = reasons


class PolicyResolver:
    """The system resolver with the refused addresses taken out of every answer: the client
    connects only to what is left, so no second lookup can answer differently.

    The client calls it only for host names whose form is no IP address (0x7f.3 is a name
    to it, and resolves to 127.0.0.3, which is judged here); canonical IP literals are checked
    by the caller before the request."""

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
            log.info("egress: %s refused (%s)", host, "; ".join(reasons))
            raise EgressDenied(host, reasons)
        return allowed
