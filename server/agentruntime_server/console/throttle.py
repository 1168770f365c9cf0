"""Failed sign-ins per client: after `signin_failures` within `signin_window` seconds, a client's
attempts are refused (the right token too) until the oldest of them leaves the window. A client
is an IPv4 address or an IPv6 /64 (what one host is usually given). A success clears nothing: a
tenant's own good token does not buy guesses at another's."""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict, deque

from .limits import Limits

MAX_CLIENTS = 10_000  # clients remembered; past it the one whose last failure is oldest is forgotten


def client_key(remote: str | None) -> str:
    """The client a request comes from, as the throttle and the session groups count it."""
    if not remote:
        return "-"
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote  # (a Unix socket's peer)
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class SignInThrottle:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()  # the last failure oldest first

    def retry_after(self, client: str) -> float:
        """Seconds until the client may try again (0: now)."""
        failures = self._recent(client)
        if len(failures) < self.limits.signin_failures:
            return 0.0
        return max(failures[len(failures) - self.limits.signin_failures] + self.limits.signin_window - time.monotonic(), 0.001)

    def failed(self, client: str) -> int:
        """Counts a failure; how many the client has within the window."""
        failures = self._recent(client)
        failures.append(time.monotonic())
        self._failures[client] = failures
        self._failures.move_to_end(client)
        while len(self._failures) > MAX_CLIENTS:
            self._failures.popitem(last=False)
        return len(failures)

    def _recent(self, client: str) -> deque[float]:
        failures = self._failures.get(client, deque())
        horizon = time.monotonic() - self.limits.signin_window
        while failures and failures[0] < horizon:
            failures.popleft()
        if not failures:
            self._failures.pop(client, None)
        return failures
