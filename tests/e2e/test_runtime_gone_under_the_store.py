"""A runtime whose rows are not what this process last saw: journal rows left behind by a
runtime deleted without them, and a runtime deleted (or taken over) under a process that
still writes to it. A create over such rows starts clean; a write the store did not take is
never acknowledged; and the refusal says what happened."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.domain.errors import Fenced
from agentruntime_server.domain.journal import Configured, Journal, Spawned, Tree
from agentruntime_server.domain.vocabulary import Budget, RuntimeOptions
from agentruntime_server.domain.watching.event_log import EventLog
from agentruntime_server.store import payloads
from agentruntime_server.store.postgres import PostgresStore

from tests.support.build import agent, create
from tests.support.postgres import fresh_database
from tests.support.replicas import journal_of, two_replicas
from tests.support.servers import serve
from tests.support.story import AGENTS, story

# ---- CreateRuntime over journal rows of no runtime -------------------------------------------


@pytest.fixture(params=["postgres", "sqlite"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return await fresh_database(request.getfixturevalue("postgres"), tmp_path.name)
    return f"sqlite:///{tmp_path / 'store.db'}"


async def sql(url: str, query: str, *parameters: Any) -> list[tuple[Any, ...]]:
    """`query` (written with $1, $2...) on the store at `url`, committed; its rows."""
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            rows = db.execute(re.sub(r"\$\d+", "?", query), parameters).fetchall()
            db.commit()
        return rows
    connection = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await connection.fetch(query, *parameters)]
    finally:
        await connection.close()


async def leave_orphans(url: str, runtime_id: str) -> None:
    """Three handles' Spawned steps under `runtime_id`, with no runtime row: what a delete of
    an earlier version left when it removed the runtime's row and not its journal."""
    for n in (1, 2, 3):
        step = payloads.encode(Spawned(f"root/a.{n}", "", "a", Budget(), "", n))
        await sql(
            url,
            "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step) VALUES ($1, $2, $3, $4, $5, $6)",
            *(runtime_id, n, 1_700_000_000.0, n, n, step),
        )


@pytest.mark.parametrize("options", [True, False], ids=["with-options", "without-options"])
async def test_a_runtime_created_over_journal_rows_of_no_runtime_starts_clean(store_url: str, options: bool) -> None:
    configured = pb.RuntimeOptions(inbox_capacity=7) if options else None
    async with serve(store=store_url) as served:
        await create(served.stub, agent("a"), runtime_id="first")  # the schema is there from now on
        await leave_orphans(store_url, "reborn")

        await served.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="reborn", agents=[agent("a")], options=configured))
        spawned = await served.stub.Spawn(pb.SpawnRequest(runtime_id="reborn", parent_id="root", agent="a"))
        assert spawned.handle_id == "root/a.1"
        listed = await served.stub.List(pb.ListRequest(runtime_id="reborn"))
        assert [handle.handle_id for handle in listed.handles] == ["root/a.1"]

    rows = await sql(
        store_url, "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = $1 ORDER BY seq", "reborn"
    )
    entries = [  # a row: a step, or a group
        entry
        for seq, at, first_event, last_event, step in rows
        for entry in payloads.ungrouped(seq, at, first_event, last_event, bytes(step))
    ]
    steps = [entry.step for entry in entries]
    expected: list[object] = [Configured(RuntimeOptions(inbox_capacity=7))] if options else []
    expected.append(Spawned("root/a.1", "", "a", Budget(), "", 1))
    assert [entry.seq for entry in entries] == list(range(1, len(expected) + 1)), "the journal does not start at seq 1"
    assert [type(step) for step in steps] == [type(step) for step in expected]
    assert isinstance(steps[-1], Spawned) and steps[-1].handle_id == "root/a.1"

    async with serve(store=store_url) as served:  # and that is what a restarted server reads
        listed = await served.stub.List(pb.ListRequest(runtime_id="reborn"))
        assert [handle.handle_id for handle in listed.handles] == ["root/a.1"]
        with pytest.raises(grpc.aio.AioRpcError) as taken:
            await create(served.stub, agent("a"), runtime_id="reborn")
        assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS


# ---- PostgreSQL without leases: a runtime deleted by another process -----------------------------


@pytest.fixture
async def lone_store(database: str) -> AsyncIterator[PostgresStore]:
    """A PostgreSQL store with no leases attached: one process, every runtime its own."""
    store = PostgresStore(database)
    yield store
    await store.close()


async def test_a_write_to_a_runtime_deleted_meanwhile_is_never_acknowledged(lone_store: PostgresStore, database: str) -> None:
    store = lone_store
    await store.create_runtime("rt", AGENTS)
    tree = Tree("rt", AGENTS)
    journal = Journal(tree, store, EventLog("rt", _nothing))
    groups = story(tree)
    await journal.record(*next(groups))
    await store.flush("rt")
    # Another process deletes the runtime: the store's next seq for it is known, no read happens.
    await sql(database, "DELETE FROM runtimes WHERE id = $1", "rt")
    await sql(database, "DELETE FROM journal WHERE runtime_id = $1", "rt")

    await journal.record(*next(groups))  # appended: the commit finds no runtime row to write to
    with pytest.raises(Fenced) as refused:
        await store.flush("rt")
    assert refused.value.gone is True
    assert "was deleted" in str(refused.value) and "not kept" in str(refused.value)
    assert await sql(database, "SELECT seq FROM journal WHERE runtime_id = $1", "rt") == []
    with pytest.raises(Fenced):  # and nothing it appends later is taken either
        await journal.record(*next(groups))
    await store.flush()  # the other runtimes' commits go on

    await store.create_runtime("rt", AGENTS)  # a runtime of that id again: it is written to
    again = Journal(Tree("rt", AGENTS), store, EventLog("rt", _nothing))
    await again.record(*next(story(again.tree)))
    await store.flush("rt")
    assert [row[0] for row in await sql(database, "SELECT seq FROM journal WHERE runtime_id = $1 ORDER BY seq", "rt")] == [1]


async def _nothing(after: int, limit: int) -> list[Any]:
    return []


# ---- replicas: the refusal names what happened --------------------------------------------------


async def test_a_fenced_write_says_whether_the_runtime_was_deleted_or_taken_over(database: str) -> None:
    async with two_replicas(database) as (a, b, admin):
        journals = {}
        for runtime_id in ("deleted", "taken"):
            await a.store.create_runtime(runtime_id, AGENTS)
            tree, journal = journal_of(a, runtime_id)
            journals[runtime_id] = (journal, story(tree))
            await journal.record(*next(journals[runtime_id][1]))
        await a.store.flush()

        await a.lapse(admin)  # a is paused past its lease: b's retention deletes one, b runs the other
        assert await b.store.delete_if_idle("deleted", time.time() + 1) is True
        assert (await b.leases.claim("taken")).owned

        for journal, groups in journals.values():  # a wakes and writes what it was doing
            await journal.record(*next(groups))
        said = {}
        for runtime_id in journals:
            with pytest.raises(Fenced) as refused:
                await a.store.flush(runtime_id)
            said[runtime_id] = str(refused.value)
        assert sorted(a.lost) == ["deleted", "taken"]
        assert "was deleted" in said["deleted"] and "replica" not in said["deleted"], said["deleted"]
        assert "moved to another replica" in said["taken"], said["taken"]
        for runtime_id in journals:  # and so does every later write
            with pytest.raises(Fenced) as again:
                await a.store.append(runtime_id, [])
            assert str(again.value) == said[runtime_id]


async def test_renewal_tells_a_deleted_runtime_from_one_taken_over(database: str) -> None:
    async with two_replicas(database) as (a, b, admin):
        for runtime_id in ("deleted", "taken", "kept"):
            await a.store.create_runtime(runtime_id, AGENTS)
        await a.lapse(admin)
        assert await b.store.delete_if_idle("deleted", time.time() + 1) is True
        assert (await b.leases.claim("taken")).owned
        assert sorted(await a.leases.renew()) == ["deleted", "taken"]
        for runtime_id, said in (("deleted", "was deleted"), ("taken", "moved to another replica")):
            with pytest.raises(Fenced) as refused:
                await a.store.append(runtime_id, [])
            assert said in str(refused.value), (runtime_id, str(refused.value))
        await a.store.append("kept", [])  # still a's
