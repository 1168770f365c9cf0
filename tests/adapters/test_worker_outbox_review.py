"""Worker calls under review: a call still queued for a worker's stream when its deadline
passes (its host reads slowly) never left the process, so it is withdrawn, never sent, and
not in doubt: another worker gets it, or it fails as taken by none, and the slow worker's
bound is not held by it; a call whose turn stopped is withdrawn too. The pool is driven as
the ServeTools edge drives it: a stream that sends a call takes it off the worker's outbox."""

from __future__ import annotations

import asyncio
import time

from agentruntime_server.domain.model import ToolCall, ToolResult, WorkerExecutor
from agentruntime_server.tools.workers import WorkerPool

from tests.support.poll import until

CHARGE = ToolCall(id="call_1", name="charge", arguments_json="{}")
KEY = "rt/root/payer.1/call_1"


async def test_a_call_its_worker_never_sent_by_the_deadline_goes_to_another_worker() -> None:
    pool = WorkerPool()
    slow = await pool.connect("default", "tools", ["charge"], 1)
    running = asyncio.ensure_future(pool.run("default", WorkerExecutor("tools", 0.3), CHARGE, KEY, "rt", "root/payer.1"))
    await until(lambda: not slow.outbox.empty(), "the call to be queued for the slow worker")
    fast = await pool.connect("default", "tools", ["charge"], 1)
    dispatch = await asyncio.wait_for(fast.outbox.get(), 10)  # once the deadline has passed
    assert dispatch is not None and dispatch.key == KEY
    assert slow.outbox.empty()  # withdrawn: its stream will never send it
    assert fast.answer(dispatch.id, ToolResult("charged once"))
    assert await asyncio.wait_for(running, 10) == ToolResult("charged once")
    # Not kept by the slow worker: its bound is free and the call may go to it again.
    assert (slow.in_hand, dict(slow.missed), slow.free) == ({}, {}, True)


async def test_a_call_no_worker_sent_by_the_deadline_fails_as_taken_by_none() -> None:
    pool = WorkerPool()
    slow = await pool.connect("default", "tools", ["charge"], 1)
    result = await asyncio.wait_for(pool.run("default", WorkerExecutor("tools", 0.3), CHARGE, KEY, "rt", "root/payer.1"), 10)
    assert result.is_error
    assert "no worker of queue 'tools' took the call within 0.3s" in result.output, result.output
    assert f"the stream of worker {slow.id} did not send it" in result.output, result.output
    assert "may or may not" not in result.output
    assert slow.outbox.empty() and slow.in_hand == {} and KEY not in slow.missed


async def test_a_call_whose_turn_stopped_is_never_sent_afterwards() -> None:
    pool = WorkerPool()
    slow = await pool.connect("default", "tools", ["charge"], 1)
    running = asyncio.ensure_future(pool.run("default", WorkerExecutor("tools", 10.0), CHARGE, KEY, "rt", "root/payer.1"))
    await until(lambda: not slow.outbox.empty(), "the call to be queued for the worker")
    running.cancel()  # an Interrupt, or the runtime closing
    await asyncio.gather(running, return_exceptions=True)
    assert slow.outbox.empty() and slow.in_hand == {}


async def test_an_answer_read_in_the_tick_its_deadline_fires_wins_over_the_deadline() -> None:
    pool = WorkerPool()
    worker = await pool.connect("default", "tools", ["charge"], 1)
    running = asyncio.ensure_future(pool.run("default", WorkerExecutor("tools", 0.2), CHARGE, KEY, "rt", "root/payer.1"))
    dispatch = await asyncio.wait_for(worker.outbox.get(), 10)  # its deadline is timed from before this
    assert dispatch is not None
    asyncio.get_running_loop().call_later(0.2, worker.answer, dispatch.id, ToolResult("charged"))
    # The loop is held past both: when it runs again, the deadline fires and then, in the same
    # tick, the answer is read (timers due together run in the order they were due).
    time.sleep(0.3)  # noqa: ASYNC251  # holding the loop is the point
    assert await asyncio.wait_for(running, 10) == ToolResult("charged")
    assert (worker.in_hand, dict(worker.missed)) == ({}, {})
