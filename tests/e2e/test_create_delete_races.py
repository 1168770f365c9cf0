"""Creating and deleting runtimes against calls under way at the same moment. DeleteRuntime
closes the runtime, then deletes it from the store; on PostgreSQL both await round trips,
and calls come in between. Once the delete has started, a call on that runtime gets
NOT_FOUND, or it was ordered before the delete and was durable: no call is acknowledged OK
whose write the delete then loses, and no copy of the runtime lives on in memory."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
from collections import Counter
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import Closed, Configured, Spawned
from agentruntime_server.domain.vocabulary import RuntimeOptions
from agentruntime_server.store import payloads

from tests.support.build import agent, create
from tests.support.model_server import ScriptedModelServer
from tests.support.postgres import fresh_database
from tests.support.process import ServerProcess
from tests.support.servers import serve

RUNTIMES = 12  # each deleted under Spawns of its own
SPAWNERS = 12  # per runtime: Spawns in flight at once while its DeleteRuntime runs
AFTER = 5  # Spawns each spawner sends once DeleteRuntime has answered: all must be NOT_FOUND

# Every journal row the store ever committed, kept by the database itself: what a delete
# removed afterwards is still there to read.
_PG_KEEP = """
CREATE TABLE committed (runtime_id TEXT, seq BIGINT, step BYTEA);
CREATE FUNCTION keep() RETURNS trigger AS $$
BEGIN INSERT INTO committed VALUES (NEW.runtime_id, NEW.seq, NEW.step); RETURN NEW; END $$ LANGUAGE plpgsql;
CREATE TRIGGER keep AFTER INSERT ON journal FOR EACH ROW EXECUTE FUNCTION keep();
"""
_SQLITE_KEEP = """
CREATE TABLE committed (runtime_id TEXT, seq INTEGER, step BLOB);
CREATE TRIGGER keep AFTER INSERT ON journal BEGIN INSERT INTO committed VALUES (NEW.runtime_id, NEW.seq, NEW.step); END;
"""


@pytest.fixture(params=["postgres", "sqlite"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return await fresh_database(request.getfixturevalue("postgres"), tmp_path.name)
    return f"sqlite:///{tmp_path / 'store.db'}"


async def keep_committed(url: str) -> None:
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            db.executescript(_SQLITE_KEEP)
        return
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(_PG_KEEP)
    finally:
        await connection.close()


async def committed_steps(url: str, runtime_id: str) -> list[object]:
    query = "SELECT step FROM committed WHERE runtime_id = {} ORDER BY seq"
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            rows = db.execute(query.format("?"), (runtime_id,)).fetchall()
    else:
        connection = await asyncpg.connect(url)
        try:
            rows = await connection.fetch(query.format("$1"), runtime_id)
        finally:
            await connection.close()
    return [step for (stored,) in rows for step in payloads.steps_in(bytes(stored))]  # SQLite's rows: a group commit's


async def spawn_until_deleted(
    stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, deleted: asyncio.Event
) -> list[tuple[bool, str]]:
    """Every Spawn's outcome: (sent after DeleteRuntime answered OK, the handle or the code)."""
    outcomes: list[tuple[bool, str]] = []
    after = 0
    while after < AFTER:
        late = deleted.is_set()
        after += late
        try:
            reply = await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="a"), timeout=10)
            outcomes.append((late, reply.handle_id))
        except grpc.aio.AioRpcError as error:
            outcomes.append((late, error.code().name))
    return outcomes


async def delete_under_spawns(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, url: str) -> None:
    deleted = asyncio.Event()
    spawners = [asyncio.create_task(spawn_until_deleted(stub, runtime_id, deleted)) for _ in range(SPAWNERS)]
    await asyncio.sleep(0.1)  # Spawns land all the time from here on
    await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=runtime_id), timeout=30)
    deleted.set()
    outcomes = [outcome for spawner in await asyncio.gather(*spawners) for outcome in spawner]

    late = Counter(outcome for sent_late, outcome in outcomes if sent_late)
    assert late == {"NOT_FOUND": SPAWNERS * AFTER}, f"{runtime_id}: Spawns sent once it was deleted: {late}"
    acknowledged = {outcome for _, outcome in outcomes if outcome.startswith("root/")}
    assert acknowledged, f"{runtime_id}: no Spawn landed before the delete"
    # Ordered before the delete: its Spawned step was committed, and so was the Closed step
    # the delete closes every handle with before it deletes the rows.
    steps = await committed_steps(url, runtime_id)
    spawned = {step.handle_id for step in steps if isinstance(step, Spawned)}
    closed = {step.handle_id for step in steps if isinstance(step, Closed)}
    assert not acknowledged - spawned, f"{runtime_id}: {len(acknowledged - spawned)} acknowledged Spawns never committed"
    assert not acknowledged - closed, f"{runtime_id}: {len(acknowledged - closed)} acknowledged Spawns came after its Close"
    refused = Counter(outcome for _, outcome in outcomes if not outcome.startswith("root/"))
    assert set(refused) == {"NOT_FOUND"}, f"{runtime_id}: Spawns under way as it was deleted: {refused}"


async def test_every_spawn_acknowledged_as_the_runtime_is_deleted_was_ordered_before_the_delete(
    store_url: str, tmp_path: Path, model: ScriptedModelServer
) -> None:
    ids = [f"doomed-{n}" for n in range(RUNTIMES)]
    process = ServerProcess(store_url, model.base_url, tmp_path / "server.log")
    stub = await process.start()
    try:
        for runtime_id in ids:
            await create(stub, agent("a"), runtime_id=runtime_id)
        await keep_committed(store_url)
        for runtime_id in ids:  # one at a time: each is a chance of its own that a Spawn comes in between
            await delete_under_spawns(stub, runtime_id, store_url)

        for runtime_id in ids:
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await stub.List(pb.ListRequest(runtime_id=runtime_id))
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await stub.ListRuntimes(pb.ListRuntimesRequest())
        assert [summary.runtime_id for summary in listed.runtimes] == []
        # Nothing of the old runtimes is left, in memory or in the store: one of the same id starts anew.
        for runtime_id in ids:
            await create(stub, agent("a"), runtime_id=runtime_id)
            reply = await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="a"))
            assert reply.handle_id == "root/a.1"

        await process.stop(signal.SIGTERM)
        stub = await process.restart()  # and that is what the store holds
        for runtime_id in ids:
            listed_handles = await stub.List(pb.ListRequest(runtime_id=runtime_id))
            assert [handle.handle_id for handle in listed_handles.handles] == ["root/a.1"]
    finally:
        await process.stop()


# ---- CreateRuntime -------------------------------------------------------------------------


# The transaction every row of a runtime was inserted by (updates leave no trace here).
_PG_NOTE_INSERTS = """
CREATE TABLE inserted (tab TEXT, runtime_id TEXT, xid BIGINT);
CREATE FUNCTION note() RETURNS trigger AS $$
BEGIN INSERT INTO inserted VALUES (TG_TABLE_NAME, to_jsonb(NEW)->>TG_ARGV[0], txid_current()); RETURN NEW; END $$
LANGUAGE plpgsql;
CREATE TRIGGER note AFTER INSERT ON runtimes FOR EACH ROW EXECUTE FUNCTION note('id');
CREATE TRIGGER note AFTER INSERT ON journal FOR EACH ROW EXECUTE FUNCTION note('runtime_id');
"""


async def test_a_runtime_and_its_options_are_committed_in_one_transaction(database: str) -> None:
    """A crash between two commits left a runtime without its options, its id taken."""
    async with serve(store=database) as served:
        await create(served.stub, agent("a"), runtime_id="first")  # the schema is there from now on
        connection = await asyncpg.connect(database)
        try:
            await connection.execute(_PG_NOTE_INSERTS)
            options = pb.RuntimeOptions(inbox_capacity=7, max_concurrent_model_calls=2)
            request = pb.CreateRuntimeRequest(runtime_id="configured", agents=[agent("a")], options=options)
            await served.stub.CreateRuntime(request)
            inserted = await connection.fetch("SELECT tab, xid FROM inserted WHERE runtime_id = 'configured'")
            journaled = await connection.fetch("SELECT step FROM journal WHERE runtime_id = 'configured'")
        finally:
            await connection.close()
        assert [payloads.decode(bytes(row["step"])) for row in journaled] == [
            Configured(RuntimeOptions(inbox_capacity=7, max_concurrent_model_calls=2))
        ]
        assert sorted(row["tab"] for row in inserted) == ["journal", "runtimes"]
        assert len({row["xid"] for row in inserted}) == 1, "the runtime and its options were committed apart"
        reply = await served.stub.Spawn(pb.SpawnRequest(runtime_id="configured", parent_id="root", agent="a"))
        assert reply.handle_id == "root/a.1"  # the journal goes on after them


QUOTA = 5


async def test_two_replicas_creating_at_once_keep_the_tenants_runtimes_quota(
    database: str, tmp_path: Path, model: ScriptedModelServer
) -> None:
    env = {"AGENTRUNTIME_QUOTA_RUNTIMES": str(QUOTA)}
    replicas = [ServerProcess(database, model.base_url, tmp_path / f"replica-{n}.log", env) for n in range(2)]
    try:
        stubs = [await replica.start() for replica in replicas]
        for round_ in range(3):  # each round, every free place is raced for by both replicas at once
            creates = [
                stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[agent("a")]), timeout=30) for stub in stubs for _ in range(10)
            ]
            outcomes = await asyncio.gather(*creates, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, grpc.aio.AioRpcError):
                    assert outcome.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
                else:
                    assert isinstance(outcome, pb.CreateRuntimeResponse), outcome
            listed = await stubs[0].ListRuntimes(pb.ListRuntimesRequest(page_size=100))
            created = {outcome.runtime_id for outcome in outcomes if isinstance(outcome, pb.CreateRuntimeResponse)}
            assert len(listed.runtimes) == QUOTA, f"round {round_}: {len(listed.runtimes)} runtimes, the quota {QUOTA}"
            assert created == {summary.runtime_id for summary in listed.runtimes}
            for runtime_id in created:
                await stubs[0].DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=runtime_id), timeout=30)
    finally:
        for replica in replicas:
            await replica.stop()
