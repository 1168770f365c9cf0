"""A made-up host name whose DNS answers from a test's script: what a hostile name's owner
can do (DNS rebinding). The process's resolver is replaced for that one name only."""

from __future__ import annotations

import socket
from typing import Any

import pytest

REBOUND = "rebinding.test"


class RebindingDns:
    """Answers each of `answers` in turn, and the last one for every question after."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers = ["127.0.0.1"]
        resolve = socket.getaddrinfo

        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else host
            if name != REBOUND:
                return resolve(host, port, *args, **kwargs)
            address = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port)))]

        # asyncio's loop.getaddrinfo (and so anyio's and aiohttp's resolvers) calls it by this name.
        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    def rebind(self) -> None:
        """An allowed address first (nothing listens there: the tests deny only 127.0.0.1),
        then the denied 127.0.0.1: a check and a connect that resolve apart get different answers."""
        self.answers = ["127.0.0.3", "127.0.0.1"]
