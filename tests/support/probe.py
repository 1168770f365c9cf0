"""A bystander's latency: another client, on its own thread (so it measures wall time even if
the server's event loop stalls), that loops Inspect on another runtime and keeps every latency.

What a test may judge from it is whether the server's loop *stalled*: a loop held by hostile work
(a backtracking regex, a synchronous parse of megabytes) answers nothing for seconds. How fast an
Inspect is belongs to `make bench`: on a shared 2-core machine one Inspect in a few dozen can take
a few hundred milliseconds for reasons of its own (a CI run saw 339 ms), so STALLED is a second."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

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
