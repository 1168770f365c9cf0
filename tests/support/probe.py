"""A bystander's latency: another client, on its own thread (so it measures wall time even if
the server's event loop stalls), that loops Inspect on another runtime (or another tenant's
ListRuntimes and a health check) and keeps every latency.

What a test may judge from it is whether the server's loop *stalled*: a loop held by hostile work
(a backtracking regex, a synchronous parse of megabytes) answers nothing for seconds. How fast an
Inspect is belongs to `make bench`: on a shared 2-core machine one Inspect in a few dozen can take
a few hundred milliseconds for reasons of its own (a CI run saw 339 ms), so STALLED is a second."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.poll import until

STALLED = 1.0  # seconds without an answer that only a held event loop explains


class InspectProbe:
    """`metadata`: the bystander's credentials, if the server asks for any."""

    def __init__(self, address: str, runtime_id: str, handle_id: str, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.address, self.runtime_id, self.handle_id = address, runtime_id, handle_id
        self.metadata = tuple(metadata)
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    async def __aenter__(self) -> InspectProbe:
        self._thread.start()
        await until(self._ready.is_set, "the probe to connect", timeout=10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 10)

    def _loop(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            other = pb_grpc.AgentRuntimeStub(channel)
            request = pb.InspectRequest(runtime_id=self.runtime_id, handle_id=self.handle_id)
            other.Inspect(request, metadata=self.metadata, timeout=10)  # the connection is up before timing starts
            self._ready.set()
            while not self._stop.is_set():
                started = time.monotonic()
                other.Inspect(request, metadata=self.metadata, timeout=10)
                self.latencies.append(time.monotonic() - started)
                time.sleep(0.002)


class TenantProbe(InspectProbe):
    """Another tenant's ListRuntimes and a health check, in turn, each latency kept (a call the
    server did not answer in 10 s counts as taking them, and the probe goes on)."""

    def __init__(self, address: str, metadata: Sequence[tuple[str, str]]) -> None:
        super().__init__(address, "", "", metadata)

    def _loop(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            listing = pb_grpc.AgentRuntimeStub(channel).ListRuntimes
            health = health_pb2_grpc.HealthStub(channel).Check
            calls = ((listing, pb.ListRuntimesRequest(), self.metadata), (health, health_pb2.HealthCheckRequest(), ()))
            for method, request, metadata in calls:
                method(request, metadata=metadata, timeout=10)  # the connection is up before timing starts
            self._ready.set()
            while not self._stop.is_set():
                for method, request, metadata in calls:
                    started = time.monotonic()
                    try:
                        method(request, metadata=metadata, timeout=10)
                    except grpc.RpcError as error:
                        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                            raise
                    self.latencies.append(time.monotonic() - started)
                time.sleep(0.01)


def rss_mib(pid: int) -> float:
    """The process's resident memory now, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")
