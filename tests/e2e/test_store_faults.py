"""A store in trouble: a replica's read racing its own claim of the runtime, a SQLite store
broken by a failed commit (the server must be restarted), PostgreSQL connections cut (the
server reconnects by itself), a database unreachable at startup. Real
PostgreSQL and SQLite, real servers, faults made by the database itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
import urllib.parse
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.app import SERVICE_NAME
from agentruntime_server.domain.journal import Journal, Tree
from agentruntime_server.domain.ownership import Claim
from agentruntime_server.domain.watching.event_log import EventLog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.build import agent, create, http_tool, spawn, status_details
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import eventually, until
from tests.support.postgres import cut_connections, fresh_database
from tests.support.process import free_port
from tests.support.replicas import LEASE, Pair, Replica, cut_off, journal_of, pair, settled_at, started_run, two_replicas
from tests.support.servers import serve
from tests.support.story import AGENTS, story
from tests.support.tool_server import ToolServer

__all__ = ["pair"]  # the fixture of tests/support/replicas.py, used here


@pytest.fixture
async def replicas(database: str) -> AsyncIterator[tuple[Replica, Replica, Any]]:
    async with two_replicas(database) as replicas:
        yield replicas


async def _nothing(after: int, limit: int) -> list[Any]:
    return []


async def blocked(admin: Any, query: str) -> None:
    """Until a statement starting with `query` waits on a lock."""

    async def waiting() -> bool:
        return bool(
            await admin.fetchval(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1", query + "%"
            )
        )

    await eventually(waiting, f"{query!r} to wait on a lock")


async def test_a_read_from_before_the_last_owners_commit_that_ends_after_a_claim_spoils_no_append(
    replicas: tuple[Replica, Replica, Any], database: str
) -> None:
    """B reads a runtime A runs (an Inspect at B): its snapshot misses A's last commit, and the
    read ends only after A handed the runtime over and B claimed it. B must append after
    what A wrote, not after what its old read saw."""
    a, b, admin = replicas
    await a.store.create_runtime("rt", AGENTS)
    tree, journal = journal_of(a, "rt")
    groups = story(tree)
    for _ in range(3):
        await journal.record(*next(groups))
    await a.store.flush("rt")

    row_lock, table_lock = await asyncpg.connect(database), await asyncpg.connect(database)
    try:
        # A's next commit waits on the runtime's row, holding the journal table for writing.
        row_locked = row_lock.transaction()
        await row_locked.start()
        await row_lock.execute("SELECT 1 FROM runtimes WHERE id = 'rt' FOR UPDATE")
        await journal.record(*next(groups))
        committing = asyncio.ensure_future(a.store.flush("rt"))
        await blocked(admin, "\nWITH mine AS")  # A's commit
        # A lock queued behind that commit: B's read of the journal will wait behind it.
        table_locked = table_lock.transaction()
        await table_locked.start()
        locking = asyncio.ensure_future(table_lock.execute("LOCK TABLE journal IN ACCESS EXCLUSIVE MODE"))
        await blocked(admin, "LOCK TABLE journal")
        # B's read takes its snapshot (without A's commit), then waits for the journal.
        reading = asyncio.ensure_future(b.store.load("rt"))
        await blocked(admin, "SELECT seq, at")  # B's read of the journal
        await row_locked.rollback()
        await committing  # A's commit lands
        await locking
        await a.leases.release("rt")  # a graceful handoff
        assert await b.leases.claim("rt") == Claim(owned=True)
        await table_locked.rollback()
        stale = await reading
    finally:
        await row_lock.close()
        await table_lock.close()
    assert stale is not None and len(stale.entries) < journal.last_seq  # it did miss A's last commit

    # B runs the runtime from a read made after its claim, as a takeover does.
    stored = await b.store.load("rt")
    assert stored is not None and [entry.seq for entry in stored.entries] == list(range(1, journal.last_seq + 1))
    rebuilt = Tree("rt", AGENTS)
    continued = Journal.restore(rebuilt, b.store, EventLog("rt", _nothing), stored.entries)
    await continued.record(*next(groups))
    await b.store.flush("rt")
    again = await b.store.load("rt")
    assert again is not None and [entry.seq for entry in again.entries] == list(range(1, continued.last_seq + 1))


# ---- a broken store: the server's fault, and it says so ---------------------------------------


async def break_sqlite(url: str) -> None:
    """The next journal write fails, as on a full disk (another connection adds a trigger)."""
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)) as db:
        db.execute("CREATE TRIGGER refuse BEFORE INSERT ON journal BEGIN SELECT RAISE(ABORT, 'disk I/O secret'); END")


async def test_a_broken_sqlite_store_answers_unavailable_and_the_health_service_stops_serving(
    model: ScriptedModelServer, tmp_path: Path
) -> None:
    """A commit failed: the server acknowledges nothing more until it is restarted. Callers are
    told so with UNAVAILABLE (retry elsewhere, or once it is back), never INTERNAL, and with
    nothing of the database's error; health checks say NOT_SERVING, so that a load balancer
    sends them elsewhere."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with serve(store=url, llm_style="openai", llm_base_url=model.base_url) as served:
        runtime_id = await create(served.stub, agent("solo"))
        await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="solo"), timeout=10)
        await break_sqlite(url)
        calls: list[Awaitable[object]] = [
            served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="solo"), timeout=10),
            served.stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id="root"), timeout=10),
            served.stub.ListRuntimes(pb.ListRuntimesRequest(), timeout=10),
        ]
        for call in calls:  # the call that broke it, and every one after
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            error = refused.value
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "must be restarted" in (error.details() or "")
            assert not any(word in (error.details() or "") for word in ("secret", "INSERT", "terminat", "SQL"))
            assert [type(d).__name__ for d in status_details(error)] == ["ErrorInfo", "RetryInfo"]
            assert status_details(error)[0].reason == "STORE_BROKEN"

        health = health_pb2_grpc.HealthStub(served.channel)
        for service in ("", SERVICE_NAME):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_postgres_connections_cut_are_refused_cleanly_and_the_server_reconnects_by_itself(
    postgres: str, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The server's connections are cut (a failover, a network fault): the call whose commit
    failed is answered UNAVAILABLE STORE_UNAVAILABLE with RetryInfo, never INTERNAL and with
    nothing of the database's error; the server reconnects by itself (no restart), serves
    again, and the runtime goes on from what the store holds: the refused Spawn was not kept."""
    url = await fresh_database(postgres, tmp_path.name)
    async with serve(store=url, llm_style="openai", llm_base_url=model.base_url) as served:
        runtime_id = await create(served.stub, agent("solo"))
        first = await spawn(served.stub, runtime_id, "solo")
        await cut_connections(url)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="solo"), timeout=10)
        error = refused.value
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        assert "reconnects by itself" in (error.details() or "")
        assert not any(word in (error.details() or "") for word in ("secret", "INSERT", "terminat", "SQL", "asyncpg"))
        assert [type(d).__name__ for d in status_details(error)] == ["ErrorInfo", "RetryInfo"]
        assert status_details(error)[0].reason == "STORE_UNAVAILABLE"

        health = health_pb2_grpc.HealthStub(served.channel)

        async def serving() -> bool:
            checked = [await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5) for name in ("", SERVICE_NAME)]
            return all(reply.status == health_pb2.HealthCheckResponse.SERVING for reply in checked)

        await eventually(serving, "the server to serve again once it reconnected")

        async def handles() -> list[str] | None:
            try:
                listed = await served.stub.List(pb.ListRequest(runtime_id=runtime_id), timeout=5)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error  # until the store is back: nothing else
                return None
            return sorted(handle.handle_id for handle in listed.handles)

        await eventually(handles, "the runtime to be read again")
        assert await handles() == [first]  # the refused Spawn's handle was never kept
        again = await spawn(served.stub, runtime_id, "solo")
        assert await handles() == sorted([first, again])


async def test_an_owner_whose_connections_are_cut_reconnects_and_its_run_goes_on(pair: Pair, tools: ToolServer) -> None:
    """The owner's connections are cut with a tool call in flight: its next commit fails, its
    copy of the runtime stops, and it reconnects by itself; what either replica answers
    meanwhile is a result or UNAVAILABLE, never INTERNAL, and the run goes on from its journal
    (at the owner once it is back, or at the other replica if it claimed the runtime first):
    the tool call, in doubt, is made again with the same key."""
    tools.delays["hit"] = 1.0
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    assert await cut_off(pair) >= 1
    try:
        await other.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="more"), timeout=10)
    except grpc.aio.AioRpcError as error:  # forwarded to an owner whose store is away: retry
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    result = await settled_at(other, runtime_id, handle_id, patience=LEASE * 8)  # retried: UNAVAILABLE only
    assert (result.status, result.text) == (pb.STATUS_DONE, "done")
    assert len(set(tools.keys)) == 1  # one call, however often it was made: one key
    assert pair.owner.channel is not None
    health = health_pb2_grpc.HealthStub(pair.owner.channel)

    async def serving() -> bool:
        checked = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        serves: bool = checked.status == health_pb2.HealthCheckResponse.SERVING
        return serves

    await eventually(serving, "the owner to serve again by itself")


async def test_a_store_that_breaks_while_the_server_recovers_is_never_said_to_be_serving(
    model: ScriptedModelServer, tools: ToolServer, tmp_path: Path
) -> None:
    """The commit that breaks the store is recovery's own (a call in doubt is journaled as such,
    before the server starts): health checks say NOT_SERVING from the first."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    model.script("payer", lambda body: Reply(calls=[("charge", {})]) if tool_results(body) == 0 else Reply(text="paid"))
    tools.delays["charge"] = 30
    charge = http_tool("charge", tools.url("charge"))
    charge.on_interrupted = pb.ON_INTERRUPTED_ASK
    async with serve(store=url, llm_style="openai", llm_base_url=model.base_url) as served:
        runtime_id = await create(served.stub, agent("payer", tools=[charge]))
        handle_id = await spawn(served.stub, runtime_id, "payer")
        await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
        await until(lambda: bool(tools.in_flight_keys), "the charge call to be in flight")
    await break_sqlite(url)  # the server stopped with the charge in doubt

    async with serve(store=url, llm_style="openai", llm_base_url=model.base_url) as served:
        health = health_pb2_grpc.HealthStub(served.channel)
        for service in ("", SERVICE_NAME):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING, service
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # a read: the store broke before it
            await served.stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        assert "must be restarted" in (refused.value.details() or "")


# ---- a store that cannot be opened at startup -------------------------------------------------

PASSWORD = "hunter2-never-shown"


async def serve_command(store: str) -> tuple[int, str]:
    """`agentruntime serve` on the store: its exit code and what it printed (it must not start)."""
    env = {**os.environ, "AGENTRUNTIME_METRICS_LISTEN": "off", "AGENTRUNTIME_LLM_STYLE": "scripted"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentruntime_server", "serve", "--listen", "127.0.0.1:0", "--store", store,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, (out + err).decode()


async def test_a_store_that_cannot_be_opened_stops_the_start_with_one_line(postgres: str, tmp_path: Path) -> None:
    """No traceback: one line naming the store (never its password), and exit code 2."""
    server = urllib.parse.urlsplit(postgres)
    socket = dict(urllib.parse.parse_qsl(server.query)).get("host") or server.netloc.rpartition("@")[2]
    closed = free_port()
    not_a_database = tmp_path / "notes.txt"
    not_a_database.write_text("not SQLite\n" * 100)
    runs = {
        f"error: AGENTRUNTIME_STORE: cannot use the PostgreSQL store at 127.0.0.1:{closed} (ConnectionRefusedError": (
            f"postgresql://agent:{PASSWORD}@127.0.0.1:{closed}/agentruntime"
        ),
        f"error: AGENTRUNTIME_STORE: cannot use the PostgreSQL store at {socket} (InvalidCatalogNameError": (
            server._replace(netloc=f"{server.username}:{PASSWORD}@{server.netloc.rpartition('@')[2]}", path="/nowhere").geturl()
        ),
        "error: AGENTRUNTIME_STORE: not a valid PostgreSQL URL": (  # an unencoded '#': the URL parses wrong
            f"postgresql://agent:{PASSWORD[:6]}#{PASSWORD[7:]}@127.0.0.1:{closed}/agentruntime"
        ),
        f"error: AGENTRUNTIME_STORE: cannot open the SQLite store {not_a_database / 'agentruntime.db'}": (
            f"sqlite:///{not_a_database / 'agentruntime.db'}"  # under a file, not a directory
        ),
        f"error: AGENTRUNTIME_STORE: cannot open the SQLite store {not_a_database}: file is not a database": (
            f"sqlite:///{not_a_database}"
        ),
    }
    for says, store in runs.items():
        code, text = await serve_command(store)
        assert code == 2, text
        assert text.startswith(says) and text.count("\n") == 1, text
        assert "Traceback" not in text
        assert not any(piece in text for piece in (PASSWORD, PASSWORD[:6], PASSWORD[7:])), text
