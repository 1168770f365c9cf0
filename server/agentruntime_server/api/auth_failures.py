"""Failed authentications on the gRPC port: each one counted (the Prometheus metric
`agentruntime_auth_failures_total{grpc_method, reason}`) and logged on the auth logger with the
RPC, the peer's address and the reason, never the credential (a refusal's message quotes none).

A stranger can fail as fast as it can send: lines past LINES_PER_SECOND in one second are not
written one by one; the first line of the next second says how many were left out (the metric
counts them all)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..domain.errors import Unauthenticated

log = logging.getLogger("agentruntime_server.api.auth")  # what operators filter on for auth

LINES_PER_SECOND = 20


class FailedAuthentications:
    def __init__(self, count: Callable[[str, str], None] | None = None) -> None:
        """`count(method, reason)`: the metric, when metrics are on."""
        self._count = count
        self._second = 0
        self._lines = 0
        self._left_out = 0

    def record(self, method: str, peer: str, refused: Unauthenticated) -> None:
        if self._count is not None:
            self._count(method, refused.reason)
        second = int(time.monotonic())
        if second != self._second:
            self._second, self._lines = second, 0
        if self._lines >= LINES_PER_SECOND:
            self._left_out += 1
            return
        self._lines += 1
        left_out, self._left_out = self._left_out, 0
        log.warning(
            "authentication failed: rpc=%s peer=%s reason=%s: %s%s",
            method,
            peer[:128] or "-",
            refused.reason,
            refused,
            f" ({left_out} more failed authentications before this one were not logged one by one)" if left_out else "",
        )
