"""A worker call kept past its deadline, under review: when the worker that kept it leaves,
the call's end (WorkerLost, set on a future nobody awaits any more) is expected, not an
error of the server's: nothing is logged as an exception never retrieved."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.domain.model import ToolCall, WorkerExecutor
from agentruntime_server.tools.workers import WorkerPool

from tests.api.test_workers import calls_then_answer, serving, worker_tool
from tests.support.build import agent, create, run
from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.servers import Served

CHARGE = ToolCall(id="call_1", name="charge", arguments_json="{}")
KEY = "rt/root/payer.1/call_1"


async def test_a_worker_leaving_with_a_call_it_kept_past_its_deadline_logs_no_unretrieved_exception(
    served: Served, model: ScriptedModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model.script("payer", calls_then_answer(("charge", {})))
    runtime_id = await create(served.stub, agent("payer", tools=[worker_tool("charge", timeout=0.5)]))
    held: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        held.append(call.id)
        await asyncio.sleep(3600)
        return "never"

    pool = served.running.workers
    async with Client(f"127.0.0.1:{served.port}") as client:
        async with serving(client, "tools", {"charge": hangs}):
            _, result = await run(served.stub, runtime_id, "payer", "pay")
            assert held, "the worker should have been sent the call"
            assert result.status == pb.STATUS_DONE, result
            assert "may or may not have taken effect" in result.text, result.text
        await until(lambda: not pool._queues, "the worker to leave")  # type: ignore[union-attr]
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        await asyncio.sleep(0.1)  # the kept call's done callbacks run
        gc.collect()
    unretrieved = [record.getMessage() for record in caplog.records if "never retrieved" in record.getMessage()]
    assert unretrieved == [], unretrieved


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
