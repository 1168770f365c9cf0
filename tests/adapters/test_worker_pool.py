"""The worker pool's per-queue lock survives calls stopped while they wait for a worker.

A call waiting for a free worker of its queue waits on the queue's asyncio.Condition with a
timeout. Under `asyncio.wait_for` (Python 3.11) that wait runs in a task of its own; a turn
stopped twice (an Interrupt and a Close, a run stopped as its timeout fires) could leave the
condition's lock taken by a task that was gone: every later worker registration
(ServeTools) and every call of that queue then waited for ever. Found by the worker hunt
(tests/test_worker_hunt.py) as a registration left unanswered. Here the pool is driven
directly, with seeded random stops, and must stay usable."""

from __future__ import annotations

import asyncio
import random

from agentruntime_server.domain.model import ToolCall, WorkerExecutor
from agentruntime_server.tools.workers import WorkerPool


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
