"""Replicas: a command or a wait for a runtime another replica executes is forwarded to
that replica, as the caller sent it (its request and its credentials), and its answer,
rich error details included, is relayed back as is. The owner authenticates the call
again; a forwarded call is never forwarded a second time.

Forwarding rather than a command table: a call reaches the owner in one hop with no
polling and no table to clean, Wait and Watch stream from the process where the events
happen, and the owner's answer (a TaskResult, an error with its details) needs no second
encoding. The database still decides who the owner is (store/postgres/leases.py)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

FORWARDED = "x-agentruntime-forwarded"
# Set by the gRPC stack of each hop, not by the caller.
_HOP_BY_HOP = frozenset({"user-agent", "te", "content-type", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout"})
# Calls a replica repeats, while the caller's deadline allows, when the owner cannot be
# reached (it died, or it is handing its runtimes over): they change nothing twice.
RETRIED = frozenset({"Wait", "Resume", "Inspect", "List", "GetTranscript", "Watch"})

Metadata = Sequence[tuple[str, str | bytes]]


class Relayed(Exception):
    """The owner's answer was an error: the edge gives it to the caller as it came."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = trailing


class PeerUnavailable(Exception):
    """The owner could not be reached, or is handing the runtime over: ask again who owns it."""


def forwarded(metadata: Metadata) -> bool:
    return any(key == FORWARDED for key, _ in metadata)


def forwarded_by(metadata: Metadata) -> str | None:
    """The id of the replica that forwarded this call, if one did (for the audit line)."""
    for key, value in metadata:
        if key == FORWARDED:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


def backoff(attempt: int) -> float:
    """Seconds before the next try: 50 ms doubling to 1 s, with full jitter."""
    return random.uniform(0.0, min(1.0, 0.05 * 2**attempt))


class Forwarder:
    def __init__(
        self, credentials: grpc.ChannelCredentials | None, options: Sequence[tuple[str, Any]] = (), replica: str = "1"
    ) -> None:
        self._credentials = credentials
        self._options = list(options)
        self._replica = replica
        self._stubs: dict[str, pb_grpc.AgentRuntimeStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _stub(self, address: str) -> pb_grpc.AgentRuntimeStub:
        stub = self._stubs.get(address)
        if stub is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=self._options)
            self._channels.append(channel)
            stub = self._stubs[address] = pb_grpc.AgentRuntimeStub(channel)
        return stub

    def _metadata(self, metadata: Metadata) -> list[tuple[str, str | bytes]]:
        kept = [(key, value) for key, value in metadata if key not in _HOP_BY_HOP and not key.startswith(":")]
        return [*kept, (FORWARDED, self._replica)]

    async def unary(self, method: str, request: Any, address: str, metadata: Metadata, timeout: float | None) -> Any:
        call = getattr(self._stub(address), method)
        try:
            return await call(request, metadata=self._metadata(metadata), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise _relayed(error) from None

    async def stream(
        self, method: str, request: Any, address: str, metadata: Metadata, timeout: float | None
    ) -> AsyncIterator[Any]:
        call = getattr(self._stub(address), method)(request, metadata=self._metadata(metadata), timeout=timeout)
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as error:
            raise _relayed(error) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        self._stubs.clear()


def _relayed(error: grpc.aio.AioRpcError) -> Exception:
    if error.code() is grpc.StatusCode.UNAVAILABLE:
        return PeerUnavailable(error.details() or "")
    return Relayed(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))
