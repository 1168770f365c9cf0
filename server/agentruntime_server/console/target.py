"""The runtime the console talks to, and how (the CLI's connection options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentruntime.client import Client


@dataclass(frozen=True)
class Target:
    """The runtime the console talks to, and how (the CLI's connection options)."""

    address: str
    tls: bool = False
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    token: str | None = None  # used by people who sign in without one
    secure_cookies: bool = False  # the console is served over HTTPS (by itself or a proxy)

    def client(self, token: str | None, *, default_token: bool = True, timeout: float = 30.0) -> Client:
        """A client with the person's token (or the console's, unless `default_token` is off)."""
        return Client(
            self.address,
            token=token or (self.token if default_token else None),
            tls=self.tls,
            root_certificates=self.ca,
            client_cert=self.cert,
            client_key=self.key,
            timeout=timeout,
            retry_window=5.0,
        )
