"""A full disk is weather too (issue #30): a server on a SQLite store whose disk (a tmpfs of
its own) the store itself fills, under load: ten host jobs in flight through the Python
client with its default options, and a filler posting notes of 48 KiB into runtimes of its
own through bare stubs until a call is refused. Refusals are UNAVAILABLE with reason
STORE_FULL (never INTERNAL), a refused CreateRuntime wrote nothing, health says NOT_SERVING.
The disk grows: the server serves again by itself, the refused CreateRuntime sent again
with its request id creates its runtime, the jobs and new ones complete exact, every
acknowledged note is there, and the file is whole. A start on the full disk exits at once
with one line saying so."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.build import agent, status_details
from tests.support.disk import fill, grow, small_disk
from tests.support.jobs import assert_each_job_once, one_root, script
from tests.support.model_server import ScriptedModelServer
from tests.support.process import ServerProcess
from tests.support.tool_server import ToolServer

JOBS = 10
DISK = "1536k"  # the store's disk: its write-ahead log alone fills it in a second
GROWN = "16m"
NOTE_BYTES = 48 * 1024  # hex: no compression shrinks it below half
FULL_FOR = 2.0  # seconds the disk stays full once the server found out
BACK_WITHIN = 5.0  # seconds after the disk grew by which the server serves again


SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", DISK) as mounted:
        yield mounted


async def health_of(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    return int(reply.status)


async def health_becomes(channel: grpc.aio.Channel, status: int, within: float, what: str) -> float:
    started = time.monotonic()
    while await health_of(channel) != status:
        assert time.monotonic() - started < within, what
        await asyncio.sleep(0.05)
    return time.monotonic() - started


class Filler:
    """Runtimes of its own, each a create, a spawn and one note, through bare stubs (no
    retries): what each call was answered, and which notes were acknowledged."""

    def __init__(self, stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
        self.stub = stub
        self.n = 0
        self.created = 0
        self.noted: list[tuple[str, str]] = []  # (runtime, handle) whose note was acknowledged
        self.refusals: list[grpc.aio.AioRpcError] = []
        self.refused_creates: list[pb.CreateRuntimeRequest] = []

    async def one(self) -> None:
        self.n += 1
        request = pb.CreateRuntimeRequest(runtime_id=f"fill-{self.n}", agents=[agent("solo")], request_id=f"fill-{self.n}")
        try:
            await self.stub.CreateRuntime(request, timeout=10)
        except grpc.aio.AioRpcError as error:
            self.refusals.append(error)
            self.refused_creates.append(request)
            return
        self.created += 1
        try:
            spawned = await self.stub.Spawn(
                pb.SpawnRequest(runtime_id=request.runtime_id, parent_id="root", agent="solo", request_id=f"s-{self.n}"),
                timeout=10,
            )
            await self.stub.Post(
                pb.PostRequest(
                    runtime_id=request.runtime_id,
                    handle_id=spawned.handle_id,
                    text=secrets.token_hex(NOTE_BYTES // 2),
                    request_id=f"p-{self.n}",
                ),
                timeout=10,
            )
        except grpc.aio.AioRpcError as error:
            self.refusals.append(error)
            return
        self.noted.append((request.runtime_id, spawned.handle_id))

    async def absent(self, request: pb.CreateRuntimeRequest) -> bool:
        listed = await self.stub.ListRuntimes(pb.ListRuntimesRequest(page_size=1000), timeout=10)
        return request.runtime_id not in {r.runtime_id for r in listed.runtimes}


def assert_refused_with_a_reason(refusals: list[grpc.aio.AioRpcError]) -> None:
    for error in refusals:
        assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
        info, retry = status_details(error)
        assert type(retry).__name__ == "RetryInfo"
        assert info.reason == "STORE_FULL", (info.reason, error.details())
        assert "no room left on its disk" in (error.details() or "")
        assert not any(word in (error.details() or "") for word in ("sqlite", "INSERT", "SQL"))


async def test_a_disk_the_store_fills_under_load_is_weather(
    disk: Path, model: ScriptedModelServer, tools: ToolServer, tmp_path: Path
) -> None:
    script(model)
    tools.delays["hit"] = 0.3
    server = ServerProcess(disk / "store.db", model.base_url, tmp_path / "server.log")
    stub = await server.start()
    assert server.channel is not None
    try:
        async with Client(server.address) as client:
            jobs = [asyncio.ensure_future(one_root(client, tools, job)) for job in range(JOBS)]
            filler = Filler(stub)
            while not filler.refused_creates:
                await filler.one()
            # A read goes on while the store cannot write: the refused create wrote nothing.
            assert await filler.absent(filler.refused_creates[0])
            await health_becomes(server.channel, NOT_SERVING, 2.0, "NOT_SERVING once a write found the disk full")

            # FULL_FOR seconds more of it: the store may get room back by itself for a while
            # (its write-ahead log moved into the database and truncated) until the database
            # takes the disk; every refusal says why, and no refused create is found.
            full_at = time.monotonic()
            while time.monotonic() - full_at < FULL_FOR:
                await filler.one()
                if filler.refused_creates and filler.refused_creates[-1].runtime_id == f"fill-{filler.n}":
                    assert await filler.absent(filler.refused_creates[-1])
                await asyncio.sleep(0.05)
            assert_refused_with_a_reason(filler.refusals)

            grow(disk, GROWN)
            back = await health_becomes(server.channel, SERVING, BACK_WITHIN, "SERVING again once the disk grew")
            # The refused creates, sent again with their request ids, create their runtimes now.
            for request in filler.refused_creates:
                created = await stub.CreateRuntime(request, timeout=10)
                assert created.runtime_id == request.runtime_id

            settled = await asyncio.gather(*jobs)  # any error a client call raised fails the test here
            settled += await asyncio.gather(*(one_root(client, tools, job) for job in range(JOBS, JOBS + 3)))
        for runtime_id, handle_id in filler.noted:  # every acknowledged note is there
            view = await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)
            assert view.handle.inbox_size == 1, (runtime_id, view.handle)
        # The jobs, and the filler's runtimes (the refused one created on its second try): nothing more.
        await assert_each_job_once(server.address, settled, len(settled) + filler.created + len(filler.refused_creates))
        print(
            f"\n{len(filler.noted)} notes acknowledged; {len(filler.refusals)} refusals, all STORE_FULL;"
            f" SERVING {back:.1f}s after the disk grew; {len(settled)} jobs exact"
        )
    finally:
        assert await server.stop(signal.SIGTERM) == 0
    log = server.log.read_text()
    assert "code=INTERNAL" not in log and "failed inside the server" not in log, log[-5000:]
    assert "the store can write again" in log
    with contextlib.closing(sqlite3.connect(disk / "store.db")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    # A start on the disk filled to its last byte: one line saying so, exit code 2.
    fill(disk)
    starting = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentruntime_server", "serve", "--listen", "127.0.0.1:0",
        env={**os.environ, "AGENTRUNTIME_STORE": f"sqlite:///{disk / 'store.db'}", "AGENTRUNTIME_METRICS_LISTEN": "off"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(starting.communicate(), timeout=60)
    lines = (out + err).decode().strip().splitlines()
    assert starting.returncode == 2 and len(lines) == 1, (starting.returncode, lines)
    assert "its disk is full" in lines[0] and "free some space" in lines[0], lines[0]
