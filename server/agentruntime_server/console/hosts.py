"""The names the console answers to. A DNS-rebinding page reaches the console's address under a
name of its own (its Host and Origin are `rebind.example`), so a request is served only when its
Host is a name the console is known by, and a form is taken only from a page of such a name."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from html import escape
from urllib.parse import urlsplit

ALWAYS = frozenset({"localhost"})  # resolved on the person's own machine: no page can rebind it


@dataclass(frozen=True)
class Site:
    """Where people reach the console: its listen address and the names given with --allow-host
    (`name` on any port, or `name:port`)."""

    listen: str = "127.0.0.1:8080"
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for entry in self.allowed_hosts:
            if _split(entry) is None:
                raise ValueError(f"--allow-host {entry!r} is no host name (name or name:port)")

    def allows(self, host: str) -> bool:
        """Whether a Host header names this console. An IP address is always one: a page can
        rebind a name, not an address, and the address is how the request got here."""
        found = _split(host)
        if found is None:
            return False
        name, port = found
        if name in ALWAYS or _is_address(name) or name == self._listen_name:
            return True
        return self._given(name, port)

    def allows_origin(self, origin: str, host: str) -> bool:
        """Whether a form came from a page of this console: its Origin is the (allowed) Host
        the request came to, or a name given with --allow-host (a proxy in front that passes
        another Host)."""
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        if parts.netloc.lower() == host.lower():
            return self.allows(host)
        found = _split(parts.netloc)
        return found is not None and self._given(*found)

    @property
    def _listen_name(self) -> str:
        found = _split(self.listen)
        return found[0] if found is not None else ""

    def _given(self, name: str, port: int | None) -> bool:
        for entry in self.allowed_hosts:
            found = _split(entry)
            if found is not None and found[0] == name and found[1] in (None, port):
                return True
        return False


def _split(host: str) -> tuple[str, int | None] | None:
    """(name, port) of `name[:port]` or `[v6][:port]`, the name lowercased without a final dot;
    None for what is no host."""
    if not host or any(char in host for char in "/?#@ \\"):
        return None
    try:
        parts = urlsplit("//" + host)
        port = parts.port
    except ValueError:
        return None
    name = (parts.hostname or "").rstrip(".")
    return (name, port) if name else None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def refusal_page(host: str) -> str:
    """The short page a request for another name gets (421: not this server's name)."""
    shown = escape(host)
    return (
        "<!doctype html><html lang=en><meta charset=utf-8><title>Not this console's name</title>"
        f"<h1>Not this console's name</h1><p>This console is not served as <code>{shown}</code>. "
        "If people reach it by that name (a proxy, a DNS name), start it with "
        f"<code>--allow-host {shown}</code> (or AGENTRUNTIME_CONSOLE_ALLOWED_HOSTS).</p></html>\n"
    )
