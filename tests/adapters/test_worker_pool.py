"""The worker pool (tools/workers.py) driven directly, as the ServeTools edge drives it (a stream
that sends a call takes it off the worker's outbox), without gRPC.

Its per-queue lock survives calls stopped while they wait for a worker. A call waiting for a
free worker of its queue waits on the queue's asyncio.Condition with a timeout. Under
`asyncio.wait_for` (Python 3.11) that wait runs in a task of its own; a turn stopped twice (an
Interrupt and a Close, a run stopped as its timeout fires) could leave the condition's lock
taken by a task that was gone: every later worker registration (ServeTools) and every call of
that queue then waited for ever. Found by the worker hunt (tests/e2e/test_worker_hunt.py) as
a registration left unanswered. Here the pool is driven with seeded random stops, and must
stay usable.

A call that never left the process is not in doubt: one still queued for a worker's stream
when its deadline passes (its host reads slowly) or when its worker leaves, or taken off the
outbox but not yet sent, is withdrawn and never sent; another worker gets it, or it fails as
taken by none, and the slow worker's bound is not held by it. A call whose turn stopped is
withdrawn too. A call the stream sent is in doubt when its worker leaves, and a turn stopping
as its worker leaves logs no exception never retrieved."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time

import pytest
from agentruntime_server.domain.ports import WorkerLost
from agentruntime_server.domain.vocabulary import ToolCall, ToolResult, WorkerExecutor
from agentruntime_server.tools.workers import WorkerPool

from tests.support.poll import until


async def _stop_calls_while_they_wait(seed: int) -> None:
    rng = random.Random(seed)
    pool = WorkerPool()

    async def call(number: int) -> None:
        for attempt in range(3):
            executor = WorkerExecutor("q", timeout=rng.uniform(0.0005, 0.004))
            await pool.run("t", executor, ToolCall(f"c{number}.{attempt}", "x", "{}"), f"k{number}.{attempt}", "rt", "h")

    async def churn() -> None:  # workers of another tool come and go: each change wakes the waiting calls
        for _ in range(25):
            await asyncio.sleep(rng.uniform(0, 0.002))
            worker = await pool.connect("t", "q", ["other"], 1)
            await asyncio.sleep(rng.uniform(0, 0.001))
            await pool.disconnect(worker)

    calls = [asyncio.ensure_future(call(number)) for number in range(12)]
    churning = [asyncio.ensure_future(churn()) for _ in range(3)]
    for _ in range(20):  # turns stopped while their calls wait, some twice in a row
        await asyncio.sleep(rng.uniform(0, 0.002))
        stopped = rng.choice(calls)
        stopped.cancel()
        if rng.random() < 0.5:
            await asyncio.sleep(0)
            stopped.cancel()
    _, stuck = await asyncio.wait(calls + churning, timeout=5)
    assert not stuck, f"seed {seed}: {len(stuck)} tasks never ended (the queue's lock was left taken)"
    worker = await asyncio.wait_for(pool.connect("t", "q", ["x"], 1), 2)  # a registration is answered
    await pool.disconnect(worker)


async def test_calls_stopped_while_waiting_for_a_worker_leave_the_queue_usable() -> None:
    for seed in range(40):  # (with wait_for, seed 0 already left the lock taken)
        await _stop_calls_while_they_wait(seed)


# ---- a worker that leaves, and calls its stream never sent -------------------------------------

CHARGE = ToolCall(id="call_1", name="charge", arguments_json="{}")
KEY = "rt/root/payer.1/call_1"


async def test_a_turn_stopping_as_its_worker_leaves_logs_no_unretrieved_exception(caplog: pytest.LogCaptureFixture) -> None:
    """The turn stops (its task is cancelled) and, before the task runs again, the worker that
    was sent the call leaves: the call's WorkerLost is set on a future nobody reads. The pool
    is driven as the ServeTools edge drives it: no wire can order the two within one tick."""
    pool = WorkerPool()
    worker = await pool.connect("default", "tools", ["charge"], 1)
    running = asyncio.ensure_future(pool.run("default", WorkerExecutor("tools", 30.0), CHARGE, KEY, "rt", "root/payer.1"))
    dispatch = await asyncio.wait_for(worker.outbox.get(), 10)
    assert dispatch is not None and worker.outbox.sending(dispatch)
    running.cancel()  # an Interrupt
    await pool.disconnect(worker)  # in the same tick: the future holds WorkerLost when the turn's task runs
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        await asyncio.wait([running])  # not awaited itself: its CancelledError would keep the call's frame alive
        assert running.cancelled()
        del running, dispatch, worker
        gc.collect()
    unretrieved = [record.getMessage() for record in caplog.records if "never retrieved" in record.getMessage()]
    assert unretrieved == [], unretrieved


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


async def test_a_call_still_in_the_outbox_of_a_worker_that_leaves_goes_to_the_next_worker() -> None:
    """The first worker's stream never sent the call (it was still queued for it: a host that
    reads slowly backs its stream up): the call never left the process, so it is not in
    doubt; the next worker of the queue runs it."""
    pool = WorkerPool()
    first = await pool.connect("default", "tools", ["charge"], 1)
    running = asyncio.ensure_future(pool.run("default", WorkerExecutor("tools", 10.0), CHARGE, KEY, "rt", "root/payer.1"))
    await until(lambda: not first.outbox.empty(), "the call to be queued for the first worker")
    second = await pool.connect("default", "tools", ["charge"], 1)
    await pool.disconnect(first)
    dispatch = await asyncio.wait_for(second.outbox.get(), 10)
    assert dispatch is not None and dispatch.key == KEY
    second.answer(dispatch.id, ToolResult("charged once"))
    assert await asyncio.wait_for(running, 10) == ToolResult("charged once")


async def test_a_call_a_worker_stream_took_is_in_doubt_when_the_worker_leaves() -> None:
    """Taken off the outbox by the stream, the call may have reached the host: in doubt."""
    pool = WorkerPool()
    first = await pool.connect("default", "tools", ["charge"], 1)
    running = asyncio.ensure_future(pool.run("default", WorkerExecutor("tools", 10.0), CHARGE, KEY, "rt", "root/payer.1"))
    sent = await asyncio.wait_for(first.outbox.get(), 10)
    assert sent is not None and sent.key == KEY
    assert first.outbox.sending(sent)  # what the stream says before it yields the call to the host
    second = await pool.connect("default", "tools", ["charge"], 1)
    await pool.disconnect(first)
    with pytest.raises(WorkerLost):
        await asyncio.wait_for(running, 10)
    assert second.outbox.empty()


async def test_a_call_a_worker_stream_took_but_never_sent_goes_to_the_next_worker() -> None:
    """Taken off the outbox but not yet sent (the stream checks the credential first), the call
    never left the process: when the worker leaves, the next worker gets it, not in doubt."""
    pool = WorkerPool()
    first = await pool.connect("default", "tools", ["charge"], 1)
    running = asyncio.ensure_future(pool.run("default", WorkerExecutor("tools", 10.0), CHARGE, KEY, "rt", "root/payer.1"))
    taken = await asyncio.wait_for(first.outbox.get(), 10)
    assert taken is not None and taken.key == KEY
    second = await pool.connect("default", "tools", ["charge"], 1)
    await pool.disconnect(first)
    assert not first.outbox.sending(taken)  # taken back: the first stream must not send it
    again = await asyncio.wait_for(second.outbox.get(), 10)
    assert again is not None and again.key == KEY and second.outbox.sending(again)
    assert not running.done()
    running.cancel()
