"""Watchers of a long history (issue 41): a Watch from seq 0 reads its runtime's history a
page at a time, so 40 watchers that never read hold a page each, not 40 copies of the
history, and the loop goes on serving everyone else while they start.

Heavy (marked `heavy`): the runtime has 3,081 handles and 24,758 events (tests/support/
big_runtime.py, built in about a second by a server in the test's process), served by a server
process of its own (AUTH=tokens, SQLite) whose memory is read from /proc. About 15 s on a
loaded 2-core machine. Before paging (issue 41's finding) the 40 watchers took that server
from 125 to 921 MiB and held another tenant's call past its 10 s deadline; with it, +1 MiB,
nine calls in ten within 13 ms (bench/watch_memory.py, docs/performance.md#watch-history)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.big_runtime import build
from tests.support.poll import until
from tests.support.probe import STALLED, TenantProbe, rss_mib
from tests.support.process import ServerProcess
from tests.support.tenants import ACME_READER, GLOBEX, bearer

pytestmark = pytest.mark.heavy

WATCHERS = 40
GROWTH_MIB = 50  # what 40 watchers may add to the server's memory (a page each is well under 1 MiB)
ANSWERED_WITHIN = 0.1  # seconds: another tenant's calls, nine in ten at least (STALLED bounds them all)
# A client that reads nothing, with the window a default client starts with (64 KiB a stream:
# grpc's BDP probe would grow it to 4 MiB, the whole history, and make the server send it all):
# once it is full, the server's `yield` waits for the client (grpc.aio's flow control).
READS_NOTHING = [("grpc.http2.bdp_probe", 0)]


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks (USER_HZ: 100)


class PeakRss:
    """The most a process's RSS was seen at (MiB), read every 20 ms while open."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.mib = rss_mib(pid)
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.mib = max(self.mib, rss_mib(self.pid))
            await asyncio.sleep(0.02)

    async def __aenter__(self) -> PeakRss:
        self._task = asyncio.ensure_future(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.mib = max(self.mib, rss_mib(self.pid))


class Quiet:
    """The process used less than a third of a core over the last half second: it has sent
    what the watchers' windows take and only answers the probe."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: deque[tuple[float, float]] = deque()

    def __call__(self) -> bool:
        now, used = time.monotonic(), cpu_seconds(self.pid)
        self.samples.append((now, used))
        while now - self.samples[0][0] > 0.5:
            self.samples.popleft()
        since, before = self.samples[0]
        return now - since >= 0.4 and (used - before) / (now - since) < 0.33


async def test_watchers_from_seq_0_that_never_read_hold_no_history_and_stall_no_one(tmp_path: Path) -> None:
    handles, last = await build(tmp_path)
    assert handles > 3000 and last > 24_000, (handles, last)  # issue 41's runtime: 3,031 handles, 24,308 events
    env = {"AGENTRUNTIME_AUTH": "tokens", "AGENTRUNTIME_AUTH_TOKENS_FILE": str(tmp_path / "tokens.json")}
    server = ServerProcess(tmp_path / "store.db", "http://127.0.0.1:9", tmp_path / "server.log", env)
    stub = await server.start()
    assert server.process is not None
    pid = server.process.pid
    reader = bearer(ACME_READER[1])  # a read-only token suffices
    try:
        first = stub.Watch(pb.WatchRequest(runtime_id="big"), metadata=reader, timeout=60)
        loaded = await first.read()
        assert isinstance(loaded, pb.WatchResponse) and loaded.event.seq == 1  # the runtime loaded: what any reader costs once
        first.cancel()
        await until(Quiet(pid), "the server to be idle", timeout=30)
        baseline = rss_mib(pid)
        async with (
            TenantProbe(server.address, bearer(GLOBEX[1])) as probe,
            PeakRss(pid) as peak,
            grpc.aio.insecure_channel(server.address, options=READS_NOTHING) as channel,
        ):
            watchers = pb_grpc.AgentRuntimeStub(channel)
            calls = [watchers.Watch(pb.WatchRequest(runtime_id="big"), metadata=reader, timeout=120) for _ in range(WATCHERS)]
            await asyncio.wait_for(asyncio.gather(*(call.initial_metadata() for call in calls)), 60)  # each is sending
            await until(Quiet(pid), "the server to have sent what the watchers' windows take", timeout=60)
            held = peak.mib - baseline
            # What the last of them gets, once it reads: every event once, in order.
            seqs = []
            async for response in calls[-1]:
                seqs.append(response.event.seq)
                if response.event.seq == last:
                    break
            assert seqs == list(range(1, last + 1))
            for call in calls:
                call.cancel()
        answered = sorted(probe.latencies)
        tenth = len(answered) // 10
        figures = (
            f"{WATCHERS} watchers took the server from {baseline:.0f} to {baseline + held:.0f} MiB; globex's calls: "
            f"{len(answered)}, nine in ten within {answered[-tenth - 1] * 1000:.0f} ms, the slowest {answered[-1] * 1000:.0f} ms"
        )
        assert held < GROWTH_MIB, figures
        assert len(answered) >= 20, figures
        assert answered[-1] < STALLED, figures
        assert answered[-tenth - 1] < ANSWERED_WITHIN, figures
    finally:
        await server.stop()
