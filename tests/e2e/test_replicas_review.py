"""Replicas under failures a review looked for: an owner paused past its lease that wakes with
work in hand, an owner whose database connections break, and calls at the other replica
meanwhile. Real server processes on a real PostgreSQL, hurt with signals and with the
database's own pg_terminate_backend."""

from __future__ import annotations

import asyncio
import signal

import asyncpg  # type: ignore[import-untyped]
import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.replicas import LEASE, Pair, cut_off, pair, settled_at, started_run
from tests.support.tool_server import ToolServer

__all__ = ["pair"]  # the fixture of tests/support/replicas.py, used here


async def test_an_owner_woken_after_its_lease_moved_buys_no_model_turn(
    pair: Pair, model: ScriptedModelServer, tools: ToolServer
) -> None:
    """The owner is paused with a tool call in flight; the other replica takes the runtime over
    and finishes it (the call in doubt runs again, the second turn is bought there). The old
    owner wakes with the tool's answer in hand: it must not buy the next turn a second time."""
    tools.delays["hit"] = 1.0
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    pair.owner.send(signal.SIGSTOP)
    # Waited on at the other replica: answered there once it has taken the runtime over.
    result = await settled_at(other, runtime_id, handle_id, patience=60)
    assert (result.status, result.text, result.turns) == (pb.STATUS_DONE, "done", 2)
    assert model.calls["solo"] == 2 and tools.hits["hit"] == 2  # the call in doubt ran again, with its key

    pair.owner.send(signal.SIGCONT)  # it reads the tool's answer it was sent while it slept
    log = pair.owner.log
    await until(lambda: "its copy stops" in log.read_text(), "the old owner to notice", timeout=30)
    await asyncio.sleep(1.0)  # a model call it would make has reached the model server by now
    assert model.calls["solo"] == 2, "the fenced replica bought a model turn"
    assert tools.hits["hit"] == 2
    again = await settled_at(owner, runtime_id, handle_id, patience=30)  # and it reads what the new owner wrote
    assert again == result


async def test_an_owner_whose_store_broke_gives_its_runtimes_up(
    pair: Pair, model: ScriptedModelServer, tools: ToolServer
) -> None:
    """The owner's database connections are cut while a tool call is in flight: its next
    commit fails, and its store takes nothing more (it must be restarted). Its lease must not
    outlive that: the other replica takes the runtime over and finishes it, rather than the
    runtime staying with an owner that can write nothing, for good."""
    tools.delays["hit"] = 1.0
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    assert await cut_off(pair) >= 1
    # Until its lease lapses the broken owner still answers what is forwarded to it, with an
    # error of its own (INTERNAL: "see the server log"); then the other replica runs the runtime.
    retried = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL)
    result = await settled_at(other, runtime_id, handle_id, patience=LEASE * 8, retried=retried)
    assert (result.status, result.text, result.turns) == (pb.STATUS_DONE, "done", 2)


async def test_a_long_wait_and_watch_at_another_replica_follow_the_runtime_when_its_owner_dies(
    pair: Pair, tools: ToolServer
) -> None:
    """A Wait (no timeout) and a Watch at the other replica, forwarded to the owner for longer
    than the retry window (three leases) when the owner is killed: both follow the runtime to
    the replica that takes it over and end with the run's result, rather than an UNAVAILABLE
    for a retry window counted from when the call began."""
    tools.delays["hit"] = 60.0  # the run outlasts the window, until the owner dies
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    waiting = asyncio.ensure_future(other.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=90))
    events: list[pb.Event] = []

    async def watch() -> None:
        async for response in other.Watch(pb.WatchRequest(runtime_id=runtime_id), timeout=90):
            events.append(response.event)
            if response.event.handle_id == handle_id and response.event.HasField("result"):
                return

    watching = asyncio.ensure_future(watch())
    await until(lambda: bool(events), "the Watch to be forwarded", timeout=20)
    await asyncio.sleep(3 * LEASE + 1)  # the calls have been forwarded for longer than the retry window
    assert not waiting.done() and not watching.done()
    tools.delays["hit"] = 0.0  # the call in doubt is quick when it runs again
    await pair.owner.stop(signal.SIGKILL)
    waited = await waiting
    assert (waited.result.status, waited.result.text, waited.result.turns) == (pb.STATUS_DONE, "done", 2)
    await watching
    assert [event.seq for event in events] == list(range(1, len(events) + 1))  # no gap, nothing twice


async def test_a_takeover_waiting_on_a_locked_row_holds_up_no_renewal(pair: Pair, tools: ToolServer) -> None:
    """A takeover's claim waits on the runtime's row for as long as another transaction holds
    it (a replica paused or cut off inside one, a slow database). Meanwhile the replica taking
    over goes on renewing its own leases, or it loses every runtime it runs; once the row is
    free, the takeover completes."""
    tools.delays["hit"] = 60.0
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    locker, watcher = await asyncpg.connect(pair.database), await asyncpg.connect(pair.database)
    try:
        async with locker.transaction():
            await locker.execute("SELECT 1 FROM runtimes WHERE id = $1 FOR UPDATE", runtime_id)
            await pair.owner.stop(signal.SIGKILL)
            for _ in range(int(LEASE * 20)):  # its lease lapses; the other replica's claim then waits on the row
                waiting = await watcher.fetchval(
                    "SELECT COUNT(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE runtimes r SET owner%'"
                )
                if waiting:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the other replica never claimed the dead owner's runtime")
            loop = asyncio.get_running_loop()
            watched_until = loop.time() + 2 * LEASE
            while loop.time() < watched_until:
                left = await watcher.fetchval(
                    "SELECT expires_at - extract(epoch FROM clock_timestamp()) FROM replicas WHERE address = $1",
                    pair.other.address,
                )
                assert left is not None and left > 0, "the replica taking over let its own lease lapse"
                await asyncio.sleep(0.2)
            tools.delays["hit"] = 0.0
    finally:
        await locker.close()
        await watcher.close()
    result = await settled_at(other, runtime_id, handle_id, patience=30)
    assert (result.status, result.text) == (pb.STATUS_DONE, "done")
