"""The store under a real server: eviction and reload, migrations, linear storage, the group
commit (SQLite). A step the store did not take is never shown, and an answer that tells of a
write leaves only once the write is committed (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import RunningServer
from agentruntime_server.domain.journal import (
    CallFinished,
    Entry,
    MessagesAppended,
    ModelReplied,
    RunStarted,
    Spawned,
    Step,
    TurnStarted,
)
from agentruntime_server.domain.vocabulary import Budget, Message
from agentruntime_server.store.payloads import GROUP_BYTES, journal_rows
from agentruntime_server.store.sqlite import SqliteStore
from agentruntime_server.store.sqlite.commits import COMMIT_PACE, LOOP_BUSY
from agentruntime_server.store.sqlite.migrations import MIGRATIONS, SchemaTooNew, migrate

from tests.support.build import agent, create, http_tool, run, spawn, views
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import eventually
from tests.support.servers import serve
from tests.support.tool_server import ToolServer


@pytest.fixture
async def durable(
    tmp_path: Path, model: ScriptedModelServer
) -> AsyncIterator[tuple[RunningServer, pb_grpc.AgentRuntimeAsyncStub]]:
    async with serve(
        llm_style="openai",
        llm_base_url=model.base_url,
        store=f"sqlite:///{tmp_path / 'agentruntime.db'}",
        runtime_cache=2,
    ) as served:
        yield served.running, served.stub


async def test_idle_runtimes_leave_memory_and_come_back_whole(
    durable: tuple[RunningServer, pb_grpc.AgentRuntimeAsyncStub], model: ScriptedModelServer
) -> None:
    running, stub = durable
    model.script(
        "coordinator",
        lambda body: (
            Reply(calls=[("task", {"agent": "explore", "prompt": "x"})], tokens=100)
            if tool_results(body) == 0
            else Reply(text="done", tokens=100)
        ),
    )
    model.script("explore", lambda body: Reply(text="found", tokens=400))
    finished = []
    for _ in range(6):
        runtime_id = await create(stub, agent("coordinator", team=["explore"]), agent("explore"))
        handle_id, result = await run(stub, runtime_id, "coordinator", "go")
        finished.append((runtime_id, handle_id, result))
    assert running.service.cached <= 2
    # What the store keeps of a runtime to append faster (its next seq) leaves memory with it:
    # before, it stayed for every runtime ever written (issue 43, a server growing by each root).
    await running.store.flush()
    assert set(running.store._next_seq) <= set(running.service.cache.runtimes)  # type: ignore[attr-defined]

    first_runtime, first_handle, first_result = finished[0]
    waited = (await stub.Wait(pb.WaitRequest(runtime_id=first_runtime, handle_id=first_handle))).result
    assert waited == first_result
    listed = await views(stub, first_runtime)
    assert (listed[first_handle].total_tokens, listed[f"{first_handle}/explore.1"].own_tokens) == (600, 400)
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=first_runtime, handle_id=first_handle))
    assert [m.role for m in transcript.messages] == ["user", "assistant", "tool", "assistant"]
    # A reloaded runtime keeps counting where it left off: the next spawn is explore.2's sibling number.
    spawned = await stub.Spawn(pb.SpawnRequest(runtime_id=first_runtime, parent_id="root", agent="coordinator"))
    assert spawned.handle_id == "root/coordinator.2"
    # Its event log, too, was persisted whole and goes on numbering where it stopped.
    events = []
    async for response in stub.Watch(pb.WatchRequest(runtime_id=first_runtime)):
        events.append(response.event)
        if response.event.HasField("spawned") and response.event.handle_id == spawned.handle_id:
            break
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    [result] = [event.result for event in events if event.HasField("result") and event.handle_id == first_handle]
    assert result == first_result
    with pytest.raises(grpc.aio.AioRpcError) as exists:
        await create(stub, agent("x"), runtime_id=first_runtime)
    assert exists.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_each_message_is_stored_once(
    durable: tuple[RunningServer, pb_grpc.AgentRuntimeAsyncStub], model: ScriptedModelServer, tools: ToolServer, tmp_path: Path
) -> None:
    _, stub = durable
    model.script(
        "looper",
        lambda body: (
            Reply(calls=[("ping", {"n": tool_results(body)})], tokens=10) if tool_results(body) < 30 else Reply(text="done")
        ),
    )
    runtime_id = await create(stub, agent("looper", tools=[http_tool("ping", tools.url("ping"))]))
    _, result = await run(stub, runtime_id, "looper", "go")
    assert (result.status, result.turns) == (pb.STATUS_DONE, 31)
    store = SqliteStore(str(tmp_path / "agentruntime.db"))  # a second reader of the file, as a restart is
    stored = await store.load(runtime_id)
    await store.close()
    assert stored is not None
    rows = [sum(len(_messages(entry.step)) for entry in stored.entries)]
    journal = sum(1 for entry in stored.entries if isinstance(entry.step, CallFinished))
    # user + 31 assistant + 30 tool messages, each once: linear in the transcript, not quadratic.
    assert rows[0] == 62
    assert journal == 30


def _messages(step: Step) -> tuple[Message, ...]:
    """The transcript messages a journal step carries (each message is in exactly one step)."""
    if isinstance(step, RunStarted | ModelReplied):
        return () if step.message is None else (step.message,)
    if isinstance(step, MessagesAppended):
        return step.messages
    return ()


def test_migrations_are_versioned_and_refuse_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        assert migrate(db) == len(MIGRATIONS)
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert migrate(db) == len(MIGRATIONS)  # nothing applied twice
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
        with pytest.raises(SchemaTooNew, match="upgrade the server"):
            migrate(db)


async def test_a_group_commit_writes_one_row_a_runtime_and_rows_of_one_step_still_read(tmp_path: Path) -> None:
    """Schema 6: a journal row holds the steps one group commit wrote for its runtime. A store
    written before it (a row a step) opens, reads as it was, and its journal goes on in groups;
    a read from an event inside a group gets only what follows it."""
    path = tmp_path / "s.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        for script in MIGRATIONS[:5]:  # schema 5: a journal row a step, as every store before schema 6
            db.executescript(script) if isinstance(script, str) else script(db)
        db.execute("PRAGMA user_version = 5")
        db.execute("INSERT INTO runtimes (id, agents, created_at, updated_at) VALUES ('rt', '[]', 0, 0)")
        old = [
            Entry(1, 1.0, 1, 1, Spawned("root/a.1", "", "a", Budget(), "", 1)),
            Entry(2, 2.0, 2, 1, RunStarted("root/a.1", None)),
        ]
        for row in journal_rows("rt", 1, old)[0]:
            db.execute("INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step) VALUES (?, ?, ?, ?, ?, ?)", row)
    store = SqliteStore(str(path))
    try:
        later = [Entry(3, 3.0, 3, 1, TurnStarted("root/a.1", 1)), Entry(4, 4.0, 4, 0, TurnStarted("root/a.1", 2))]
        later.append(Entry(5, 5.0, 4, 1, TurnStarted("root/a.1", 3)))
        await store.append("rt", later)  # seq 3 follows the rows of one step
        await store.flush()
        stored = await store.load("rt")
        assert stored is not None and stored.entries == [*old, *later]
        assert [e.seq for e in await store.entries_after_event("rt", 3)] == [5]  # 4 made no event: its last is 3
        assert [e.seq for e in await store.entries_after_event("rt", 1)] == [2, 3, 4, 5]
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT seq, last_seq FROM journal WHERE runtime_id = 'rt' ORDER BY seq").fetchall()
    assert rows == [(1, None), (2, None), (3, 5)]


async def test_one_ticks_long_run_of_steps_is_cut_into_rows_a_page_of_history_can_read_cheaply(tmp_path: Path) -> None:
    """A group row holds at most GROUP_STEPS steps and GROUP_BYTES of them after its first:
    one tick that writes 1,000 steps of a runtime (a fan-out of task children) and 3 MiB of
    another's writes rows of 256 steps and rows of at most 1 MiB; the journal reads back
    whole, and a page of it from inside a row has only what follows."""
    store = SqliteStore(str(tmp_path / "s.db"))
    try:
        for key in ("fan", "big"):
            await store.create_runtime(key, ())
        fan = [Entry(seq, 1.0, seq, 1, TurnStarted("root/a.1", seq)) for seq in range(1, 1001)]
        big = [
            Entry(seq, 1.0, seq, 1, MessagesAppended("root/a.1", (Message("tool", f"{seq}" * (200 << 10)),)))
            for seq in range(1, 16)
        ]
        await store.append("fan", fan)
        await store.append("big", big)
        await store.flush()
        assert (await store.load("fan")).entries == fan  # type: ignore[union-attr]
        assert (await store.load("big")).entries == big  # type: ignore[union-attr]
        assert await store.entries_after_event("fan", 300, 5) == fan[300:305]
        assert await store.entries_after_event("fan", 510, 100) == fan[510:610]  # across two rows
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        rows = db.execute("SELECT runtime_id, seq, last_seq, length(step) FROM journal ORDER BY runtime_id, seq").fetchall()
    assert [(seq, last) for key, seq, last, _ in rows if key == "fan"] == [(1, 256), (257, 512), (513, 768), (769, 1000)]
    sizes = [size for key, _, _, size in rows if key == "big"]
    assert len(sizes) >= 3 and all(size <= GROUP_BYTES + (300 << 10) for size in sizes), sizes


async def test_longer_rows_a_store_wrote_before_are_cut_when_it_opens(tmp_path: Path) -> None:
    """Migration 12: a row of schema 6 holding 600 steps (one tick of a wide fan-out) becomes
    rows of GROUP_STEPS at most, the same journal; the runtime's bytes are its rows' again."""
    path = tmp_path / "s.db"
    entries = [Entry(seq, 1.0 + seq, seq, 1, TurnStarted("root/a.1", seq)) for seq in range(1, 601)]
    steps = journal_rows("rt", 1, entries)[0]
    long = b"[%s]" % b",".join(b"[%d,%r,%d,%d,%s]" % (seq, at, first, last, step) for _, seq, at, first, last, step in steps)
    store = SqliteStore(str(path))
    await store.create_runtime("rt", ())
    await store.close()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute(
            "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step, last_seq) "
            "VALUES ('rt', 1, 2.0, 1, 600, ?, 600)",
            (long,),
        )
        db.execute("UPDATE runtimes SET bytes = bytes + ? WHERE id = 'rt'", (len(long),))
        for undone in ("DROP INDEX runtimes_forks", "ALTER TABLE runtimes DROP COLUMN forked_from"):  # migration 13
            db.execute(undone)
        db.execute("ALTER TABLE runtimes DROP COLUMN fork_seq")
        db.execute("PRAGMA user_version = 11")
    store = SqliteStore(str(path))
    try:
        assert (await store.load("rt")).entries == entries  # type: ignore[union-attr]
        assert await store.entries_after_event("rt", 300, 10) == entries[300:310]
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT seq, last_seq FROM journal ORDER BY seq").fetchall() == [(1, 256), (257, 512), (513, 600)]
        stored, counted = db.execute(
            "SELECT bytes, length(CAST(agents AS BLOB)) + (SELECT sum(length(step)) FROM journal) FROM runtimes"
        ).fetchone()
        assert stored == counted


async def test_a_loop_busy_when_its_commit_comes_due_commits_at_the_pace_and_loses_nothing(tmp_path: Path) -> None:
    """A commit asked for while the loop has other work queued waits until COMMIT_PACE after
    the last one, so that more steps share it; what was flushed is then durable, all of it."""
    path = tmp_path / "s.db"
    store = SqliteStore(str(path))
    try:
        await store.create_runtime("rt", ())
        await store.append("rt", [Entry(1, 1.0, 1, 1, Spawned("root/a.1", "", "a", Budget(), "", 1))])
        first_asked = time.monotonic()
        await store.flush()
        asyncio.get_running_loop().call_soon(time.sleep, LOOP_BUSY * 1.5)  # work queued ahead of the commit
        await store.append("rt", [Entry(2, 2.0, 2, 1, RunStarted("root/a.1", None))])
        await store.flush()
        # (a timer may fire up to a millisecond early: libuv's count whole ms, from the time
        # its loop read when the iteration began, which a loaded machine makes older still: a
        # full suite's run once saw 0.93 ms)
        assert time.monotonic() - first_asked >= COMMIT_PACE / 4  # without the pace: about LOOP_BUSY * 1.5
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            assert db.execute("SELECT coalesce(last_seq, seq) FROM journal ORDER BY seq DESC LIMIT 1").fetchone() == (2,)
    finally:
        await store.close()


async def test_a_runtime_that_leaves_memory_is_freed_as_it_leaves(
    durable: tuple[RunningServer, pb_grpc.AgentRuntimeAsyncStub], model: ScriptedModelServer
) -> None:
    """Nothing a runtime holds refers back to it, so one that leaves the cache is freed then,
    with the cyclic collector off: idle runtimes do not wait in memory for its next full pass."""
    running, stub = durable
    model.script("worker", lambda body: Reply(text="done", tokens=10))
    gc.disable()
    try:
        first = await create(stub, agent("worker"))
        await run(stub, first, "worker", "go")
        (key,) = [key for key in running.service.cache.runtimes if key.endswith(first)]
        left = weakref.ref(running.service.cache.runtimes[key])
        for _ in range(2):  # the cache holds 2: the first runtime leaves
            await run(stub, await create(stub, agent("worker")), "worker", "go")
        assert key not in running.service.cache.runtimes
        assert left() is None
    finally:
        gc.enable()


async def test_a_tree_of_handles_that_leaves_memory_leaves_no_cycle_behind(
    durable: tuple[RunningServer, pb_grpc.AgentRuntimeAsyncStub], model: ScriptedModelServer, tools: ToolServer
) -> None:
    """A root that delegated (a parent and a child handle, a tool with an input schema): once
    its runtime leaves the cache, every handle of it is freed, with the cyclic collector off.
    Before, a child held its parent and the parent its children: each tree that left was a
    cycle, which a serving process's collector thresholds (process/collector.py) kept for tens
    of thousands of roots (issue 43: 8 KB a root, linear past the cache)."""
    running, stub = durable
    model.script(
        "coordinator",
        lambda body: (
            Reply(calls=[("task", {"agent": "explore", "prompt": "x"})], tokens=10)
            if tool_results(body) == 0
            else Reply(text="done", tokens=10)
        ),
    )
    model.script("explore", lambda body: Reply(text="found", tokens=10))
    schema = {"type": "object", "properties": {"q": {"$ref": "#/$defs/q"}}, "$defs": {"q": {"type": "string"}}}
    agents = (agent("coordinator", team=["explore"]), agent("explore", tools=[http_tool("look", tools.url("look"), schema)]))
    await run(stub, await create(stub, *agents), "coordinator", "go")  # what a first root makes once (imports, caches)
    gc.collect()
    gc.disable()
    try:
        first = await create(stub, *agents)
        await run(stub, first, "coordinator", "go")
        (key,) = [key for key in running.service.cache.runtimes if key.endswith(first)]
        assert len(running.service.cache.runtimes[key].tree.handles) == 2
        for _ in range(2):  # the cache holds 2: the first runtime leaves
            await run(stub, await create(stub, *agents), "coordinator", "go")
        assert key not in running.service.cache.runtimes
        # What the collector finds unreachable (kept in gc.garbage to be counted): nothing of
        # the server's own, no handle, message or schema check of the roots that ran.
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = sorted(
            f"{type(each).__qualname__} {getattr(each, '__qualname__', '')}".strip()
            for each in gc.garbage
            if type(each).__module__.startswith("agentruntime_server")
            or (callable(each) and str(getattr(each, "__module__", "")).startswith("agentruntime_server"))
        )
        assert ours == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


# ---- a write the store did not take, and answers that wait for the group commit ---------------------


async def test_a_step_the_store_refused_is_never_shown_and_the_runtime_is_read_again_from_the_store(
    model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The runtime's row is gone from the file under the server (it stands for any append the
    store refuses: a row deleted, an I/O error, a write fenced): the Spawn's step is applied
    in memory, the append raises. The caller is told to retry, and nothing reads the handle
    the store never got: the next call reads the runtime from the store."""
    store = tmp_path / "agentruntime.db"
    async with serve(
        store=f"sqlite:///{store}", llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test"
    ) as served:
        runtime_id = await create(served.stub, agent("worker"))
        with contextlib.closing(sqlite3.connect(store)) as db:
            db.execute("DELETE FROM runtimes WHERE id = ?", (runtime_id,))
            db.commit()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="worker"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as listed:
            await served.stub.List(pb.ListRequest(runtime_id=runtime_id))
        assert listed.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_refusal_that_tells_of_another_calls_write_leaves_only_once_that_write_is_committed(
    model: ScriptedModelServer, database: str
) -> None:
    """A lock on the runtime's row holds the Close's step back in the group commit. A Post to
    the handle is refused because it is closed: that answer tells of the Close's write, so it
    leaves only once the write is committed (as every other answer does), never while a crash
    could still lose it."""
    async with serve(store=database, llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test") as served:
        runtime_id = await create(served.stub, agent("worker"))
        handle_id = await spawn(served.stub, runtime_id, "worker")
        admin = await asyncpg.connect(database)
        try:
            lock = admin.transaction()
            await lock.start()
            await admin.execute("SELECT 1 FROM runtimes WHERE id = $1 FOR UPDATE", runtime_id)
            closing = asyncio.ensure_future(served.stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id)))

            async def commit_waits() -> bool:
                return bool(
                    await admin.fetchval(
                        "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                )

            await eventually(commit_waits, "the Close's commit to wait on the locked row")
            posting = asyncio.ensure_future(
                served.stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="hi"))
            )
            await asyncio.sleep(0.5)
            assert not closing.done() and not posting.done()
            await lock.rollback()
            assert list((await asyncio.wait_for(closing, 10)).closed_handle_ids) == [handle_id]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(posting, 10)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await admin.close()


async def test_create_runtime_with_options_answers_only_once_its_options_are_journaled(
    model: ScriptedModelServer, database: str
) -> None:
    """The runtime's row is inserted on its own; its options are a journal step, written by the
    group commit. A lock on the journal holds that commit back: no answer leaves meanwhile, so
    a crash right after the answer cannot leave a runtime without its options (a generated id:
    the answer names no runtime the edge could flush by)."""
    async with serve(store=database, llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test") as served:
        admin = await asyncpg.connect(database)
        try:
            lock = admin.transaction()
            await lock.start()
            await admin.execute("LOCK TABLE journal IN EXCLUSIVE MODE")
            request = pb.CreateRuntimeRequest(agents=[agent("worker")], options=pb.RuntimeOptions(inbox_capacity=2))
            creating = asyncio.ensure_future(served.stub.CreateRuntime(request))
            await asyncio.sleep(0.5)
            assert not creating.done()
            await lock.rollback()
            runtime_id = (await asyncio.wait_for(creating, 10)).runtime_id
            steps = await admin.fetch("SELECT step FROM journal WHERE runtime_id = $1", runtime_id)
            assert [json.loads(row["step"])["k"] for row in steps] == ["Configured"]
        finally:
            await admin.close()
