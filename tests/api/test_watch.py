"""Watch: every change in order, persisted, resumable from the last seq seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.errors import NotFound, ResourceExhausted, Unavailable
from agentruntime_server.domain.journal import Journal, Tree, TurnStarted, events_of
from agentruntime_server.domain.watching.deltas import Delta
from agentruntime_server.domain.watching.event_log import HISTORY_PAGE, Event, EventLog
from agentruntime_server.store.memory import MemoryStore

from tests.support.build import agent, create
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.servers import serve


def team_script(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("task", {"agent": "worker", "prompt": str(i)}) for i in range(2)], tokens=100, delay=0.05)
    return Reply(text="all done", tokens=100, delay=0.05)


def worker_script(body: dict[str, Any]) -> Reply:
    if tool_results(body) < 2:
        return Reply(calls=[("ask_nothing", {})], tokens=10, delay=0.05)
    return Reply(text="worked", tokens=10, delay=0.05)


async def _read(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, after: int, until: int | None = None) -> list[pb.Event]:
    """Events after `after`; stops after `until` of them, or at the root's settled result."""
    events = []
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=after))
    async for response in call:
        events.append(response.event)
        if until is not None and len(events) >= until:
            call.cancel()  # the consumer goes away mid-run
            break
        event = response.event
        if event.handle_id == "root/lead.1" and event.WhichOneof("payload") == "result":
            call.cancel()
            break
    return events


async def test_reconnecting_watcher_misses_nothing_and_sees_nothing_twice(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("lead", team_script)
    model.script("worker", worker_script)
    denied = pb.Guardrail(tool="ask_nothing", action=pb.GUARDRAIL_ACTION_DENY, reason="no")
    worker = agent("worker", tools=[pb.ToolDef(name="ask_nothing", relay=pb.RelayTool())], guardrails=[denied])
    runtime_id = await create(stub, agent("lead", team=["worker"]), worker)
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="lead"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))

    first = await _read(stub, runtime_id, after=0, until=6)
    await asyncio.sleep(0.15)  # events go on while nobody watches
    rest = await _read(stub, runtime_id, after=first[-1].seq)
    seqs = [event.seq for event in first + rest]
    assert seqs == list(range(1, len(seqs) + 1))
    last = rest[-1]
    assert (last.handle_id, last.result.status, last.result.total_tokens) == (handle_id, pb.STATUS_DONE, 260)

    kinds = [(e.handle_id, e.WhichOneof("payload")) for e in first + rest]
    assert kinds[0] == (handle_id, "spawned")
    assert (f"{handle_id}/worker.2", "spawned") in kinds
    worker_turns = [e.turn_ended for e in first + rest if e.handle_id == f"{handle_id}/worker.1" and e.HasField("turn_ended")]
    assert [(t.turn, t.tokens, t.own_tokens) for t in worker_turns] == [(1, 10, 10), (2, 10, 20), (3, 10, 30)]
    ended = [e.tool_call_ended for e in first + rest if e.HasField("tool_call_ended") and e.handle_id.endswith("worker.1")]
    assert [(t.name, t.is_error) for t in ended] == [("ask_nothing", True), ("ask_nothing", True)]

    # Persisted: the whole history again, identical.
    replay = await _read(stub, runtime_id, after=0)
    assert [e.SerializeToString() for e in replay] == [e.SerializeToString() for e in first + rest]


async def test_watch_refuses_bad_input(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        async for _ in stub.Watch(pb.WatchRequest(runtime_id="nope")):
            pass
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    runtime_id = await create(stub, agent("a"))
    with pytest.raises(grpc.aio.AioRpcError) as negative:
        async for _ in stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=-1)):
            pass
    assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_slow_watcher_is_dropped_not_waited_for() -> None:
    store = MemoryStore()
    await store.create_runtime("rt", ())

    async def history(after: int, limit: int) -> list[Event]:
        entries = await store.entries_after_event("rt", after, limit)
        return [event for entry in entries for event in events_of(entry) if event.seq > after]

    log = EventLog("rt", history, buffer=3)
    journal = Journal(Tree("rt", ()), store, log)
    watcher = log.follow(0)
    await journal.record(TurnStarted("root/a.1", 1))
    assert (await next_event(watcher)).seq == 1
    for turn in range(2, 10):  # the runtime never waits for the watcher
        await journal.record(TurnStarted("root/a.1", turn))
    assert not log.watched
    with pytest.raises(ResourceExhausted, match="after_seq=1"):
        await anext(watcher)
    resumed = [event.seq async for event in _take(log.follow(1), 8)]
    assert resumed == list(range(2, 10))


class PagedHistory:
    """A runtime's stored history, as Runtime reads it for Watch, counting the reads and the
    most entries one read asked for."""

    def __init__(self, store: MemoryStore, key: str) -> None:
        self.store, self.key = store, key
        self.reads: list[tuple[int, int]] = []  # (after, limit)

    async def __call__(self, after: int, limit: int) -> list[Event]:
        self.reads.append((after, limit))
        entries = await self.store.entries_after_event(self.key, after, limit)
        return [event for entry in entries for event in events_of(entry) if event.seq > after]


async def test_a_watcher_reads_its_history_a_page_at_a_time_and_one_that_reads_nothing_holds_one_page() -> None:
    store = MemoryStore()
    await store.create_runtime("rt", ())
    history = PagedHistory(store, "rt")
    log = EventLog("rt", history, buffer=1000)
    journal = Journal(Tree("rt", ()), store, log)
    for turn in range(1, 1001):
        await journal.record(TurnStarted("root/a.1", turn))
    idle = log.follow(0)
    assert (await next_event(idle)).seq == 1  # ...and it reads no more
    assert history.reads == [(0, HISTORY_PAGE)]
    seqs = [event.seq async for event in _take(log.follow(0), 1000)]  # one that reads
    assert seqs == list(range(1, 1001))
    assert len(history.reads) == 1 + -(-1000 // HISTORY_PAGE)
    assert {limit for _, limit in history.reads} == {HISTORY_PAGE}
    await idle.aclose()


async def test_the_page_a_watcher_holds_counts_toward_how_far_behind_it_may_fall() -> None:
    """A watcher of buffer 8 reads pages of 2 entries (a quarter of it); while it holds one,
    the live events it may queue are 8 less what it holds. Once cut, it reads no more of
    its history, and a Watch from where it got to misses nothing."""
    store = MemoryStore()
    await store.create_runtime("rt", ())
    history = PagedHistory(store, "rt")
    log = EventLog("rt", history, buffer=8)
    journal = Journal(Tree("rt", ()), store, log)
    for turn in range(1, 21):
        await journal.record(TurnStarted("root/a.1", turn))
    watcher = log.follow(0)
    assert (await next_event(watcher)).seq == 1  # one of its page of 2 is still to send
    for turn in range(21, 28):  # 7 live events: 1 held + 7 queued = 8
        await journal.record(TurnStarted("root/a.1", turn))
    assert log.watched
    await journal.record(TurnStarted("root/a.1", 28))  # the 9th
    assert not log.watched
    with pytest.raises(ResourceExhausted, match="after_seq=1"):
        await anext(watcher)
    assert history.reads == [(0, 2)]  # no more of its history read
    assert [event.seq async for event in _take(log.follow(1), 27)] == list(range(2, 29))


@pytest.mark.parametrize("deleted", [False, True])
async def test_a_watcher_reading_its_history_is_told_at_once_when_the_log_closes(deleted: bool) -> None:
    """A shutdown (or a delete) ends a stream still sending its history at once, from where it
    got to: a slow consumer with a long history to read would otherwise be sent all of it
    first, be cut by the server's grace with CANCELLED (no after_seq to go on from), and the
    clients, which Watch again on UNAVAILABLE, would stop watching."""
    store = MemoryStore()
    await store.create_runtime("tenant:rt", ())

    async def history(after: int, limit: int) -> list[Event]:
        entries = await store.entries_after_event("tenant:rt", after, limit)
        return [event for entry in entries for event in events_of(entry) if event.seq > after]

    log = EventLog("tenant:rt", history, buffer=100)
    journal = Journal(Tree("tenant:rt", ()), store, log)
    for turn in range(1, 6):
        await journal.record(TurnStarted("root/a.1", turn))
    watcher = log.follow(0)
    assert (await next_event(watcher)).seq == 1
    log.close(deleted=deleted)
    with pytest.raises(NotFound if deleted else Unavailable, match="after seq 1" if deleted else "after_seq=1"):
        await anext(watcher)
    # A log closed before a watcher came has nothing more for it either: it is not left waiting.
    with pytest.raises(NotFound if deleted else Unavailable):
        await asyncio.wait_for(anext(log.follow(5)), 5)  # (not a hang, if it fails)


async def next_event(watcher: AsyncIterator[Event | Delta]) -> Event:
    """The next item of a watcher that follows without deltas: an event."""
    item = await anext(watcher)
    assert isinstance(item, Event), item
    return item


async def _take(events: AsyncIterator[Event | Delta], count: int) -> AsyncIterator[Event]:
    async for event in events:
        assert isinstance(event, Event), event  # followed without deltas
        yield event
        count -= 1
        if count == 0:
            return


async def test_shutdown_ends_watch_streams_at_once(model: ScriptedModelServer) -> None:
    async with serve() as served:
        stub = served.stub
        runtime_id = await create(stub, agent("a"))
        await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="a"))
        stream = stub.Watch(pb.WatchRequest(runtime_id=runtime_id))
        first = await stream.read()
        assert isinstance(first, pb.WatchResponse) and first.event.seq == 1
        started = time.monotonic()
        stopping = asyncio.ensure_future(served.stop(grace=10))
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await stream.read()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "after_seq=1" in (ended.value.details() or "")
        await stopping
        assert time.monotonic() - started < 5, "shutdown waited for the watcher"
