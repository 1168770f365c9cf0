"""Replicas on one PostgreSQL database. Two stores with their leases driven by the test the way two
processes would (`two_replicas`, `journal_of`), and two real server processes, an owner that
connects as a role of its own (the database can cut its connections) and another replica
(`pair`). Leases last LEASE seconds, so that a dead replica's runtimes move within a test's
patience."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import Journal, Tree
from agentruntime_server.domain.watching.event_log import EventLog
from agentruntime_server.store.postgres import PostgresLeases, PostgresStore
from google.protobuf import duration_pb2

from tests.support.build import agent, http_tool
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.process import ServerProcess
from tests.support.story import AGENTS
from tests.support.tool_server import ToolServer

LEASE = 3.0  # seconds (the default is 10): a dead replica's runtimes move within a test's patience


class Replica:
    """One process's view of the database: its store, its leases, the leases it lost."""

    def __init__(self, url: str, address: str) -> None:
        self.store = PostgresStore(url)
        self.leases = PostgresLeases(self.store, address, duration=LEASE)
        self.lost: list[str] = []
        self.leases.on_lost(self.lost.append)

    async def lapse(self, admin: Any) -> None:
        """As if the process had been paused past its lease: it renews nothing."""
        await admin.execute("UPDATE replicas SET expires_at = 0 WHERE id = $1", self.leases.replica_id)


@contextlib.asynccontextmanager
async def two_replicas(database: str) -> AsyncIterator[tuple[Replica, Replica, Any]]:
    """Two replicas' stores and leases on one database, driven by the test, and an admin connection."""
    first, second = Replica(database, "127.0.0.1:1001"), Replica(database, "127.0.0.1:1002")
    await first.leases.start()
    await second.leases.start()
    admin = await asyncpg.connect(database)
    yield first, second, admin
    await admin.close()
    for replica in (first, second):
        with contextlib.suppress(Exception):
            await replica.store.close()


def journal_of(replica: Replica, runtime_id: str) -> tuple[Tree, Journal]:
    tree = Tree(runtime_id, AGENTS)
    return tree, Journal(tree, replica.store, EventLog(runtime_id, no_events))


async def no_events(after: int, limit: int) -> list[Any]:
    return []


def one_call_then_done(body: dict[str, Any]) -> Reply:
    return Reply(calls=[("hit", {})], tokens=10) if tool_results(body) == 0 else Reply(text="done", tokens=10)


class Pair:
    """Two replicas on one database: `owner` creates and runs the runtime, `other` is asked."""

    def __init__(self, database: str, owner_role: str, model: ScriptedModelServer, tmp: Path) -> None:
        env = {"AGENTRUNTIME_LEASE_DURATION": str(LEASE)}
        # The owner connects as a role of its own: the database can tell its connections apart.
        parts = urllib.parse.urlsplit(database)
        as_owner = parts._replace(netloc=f"{owner_role}:@{parts.netloc.rpartition('@')[2]}").geturl()
        self.owner = ServerProcess(as_owner, model.base_url, tmp / "owner.log", env)
        self.owner_role = owner_role
        self.other = ServerProcess(database, model.base_url, tmp / "other.log", env)
        self.database = database

    async def stop(self) -> None:
        for replica in (self.owner, self.other):
            if replica.process is not None and replica.process.returncode is None:
                replica.process.send_signal(signal.SIGCONT)
                await replica.stop()


@pytest.fixture
async def pair(database: str, model: ScriptedModelServer, tmp_path: Path) -> AsyncIterator[Pair]:
    model.script("solo", one_call_then_done)
    role = f"owner_{tmp_path.name}"[:60]
    admin = await asyncpg.connect(database)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
    finally:
        await admin.close()
    made = Pair(database, role, model, tmp_path)
    try:
        yield made
    finally:
        await made.stop()


async def started_run(stub: pb_grpc.AgentRuntimeAsyncStub, tools: ToolServer) -> tuple[str, str]:
    created = await stub.CreateRuntime(
        pb.CreateRuntimeRequest(agents=[agent("solo", tools=[http_tool("hit", tools.url("hit"))])]), timeout=10
    )
    spawned = await stub.Spawn(pb.SpawnRequest(runtime_id=created.runtime_id, agent="solo"), timeout=10)
    await stub.Wake(pb.WakeRequest(runtime_id=created.runtime_id, handle_id=spawned.handle_id, prompt="go"), timeout=10)
    return created.runtime_id, spawned.handle_id


async def settled_at(
    stub: pb_grpc.AgentRuntimeAsyncStub,
    runtime_id: str,
    handle_id: str,
    patience: float,
    retried: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED),
) -> pb.TaskResult:
    """Wait at one replica until the handle settles; `retried` codes (the owner is being
    replaced) are asked again, as a client would."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        try:
            reply = await stub.Wait(
                pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id, timeout=duration_pb2.Duration(seconds=2)),
                timeout=max(1.0, deadline - loop.time()),
            )
            if reply.result.status != pb.STATUS_TIMEOUT:
                return reply.result
        except grpc.aio.AioRpcError as error:
            if error.code() not in retried or loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)
        if loop.time() > deadline:
            raise AssertionError(f"{handle_id} did not settle within {patience}s")


async def cut_off(pair: Pair) -> int:
    """Terminates every database connection of the owner, as a network fault or a database
    failover would; how many there were."""
    connection = await asyncpg.connect(pair.database)
    try:
        terminated: int = await connection.fetchval(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1", pair.owner_role
        )
        return terminated
    finally:
        await connection.close()
