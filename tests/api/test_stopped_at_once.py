"""A run stopped at once: an Interrupt or a Close that comes before the run's task took its
first step, or while the run settles. A task cancelled before its first step runs none of
its code, and a cancel landing in a run's settling ends it there: either way the handle was
left RUNNING for good and a Wait on it was dropped (the client hung to its deadline). Found
by tests/e2e/test_race_hunt.py on PostgreSQL, where calls sent at once meet more often."""

from __future__ import annotations

import asyncio

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, create, spawn
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.poll import until
from tests.support.servers import Served


async def test_an_interrupt_in_the_tick_of_the_wake_settles_the_run(served: Served, model: ScriptedModelServer) -> None:
    model.script("a", lambda body: Reply(text="never asked", tokens=5))
    runtime_id = await create(served.stub, agent("a"))
    handle_id = await spawn(served.stub, runtime_id, "a")
    runtime = await served.running.service.runtime(runtime_id)
    await runtime.wake(handle_id, "go")  # the run's task is made, not started
    assert await runtime.interrupt(handle_id)
    result = (await served.stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).result
    assert (result.status, result.turns, result.own_tokens) == (pb.STATUS_INTERRUPTED, 0, 0)
    view = (await served.stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).handle
    assert view.state == pb.HANDLE_STATE_IDLE
    assert model.calls["a"] == 0
    # It can run again, to the end.
    await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    result = (await served.stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).result
    assert (result.status, result.text, result.turns) == (pb.STATUS_DONE, "never asked", 1)


async def test_stops_sent_together_stop_the_run_once(served: Served, model: ScriptedModelServer) -> None:
    model.script("a", lambda body: Reply(text="slow", tokens=5, delay=5.0))
    runtime_id = await create(served.stub, agent("a"))
    handles = [await spawn(served.stub, runtime_id, "a") for _ in range(4)]
    runtime = await served.running.service.runtime(runtime_id)
    for handle_id in handles:
        await runtime.wake(handle_id, "go")
    await until(lambda: model.in_flight == len(handles), "every run to be in its model call")
    stops = []
    for handle_id in handles:
        stops += [runtime.interrupt(handle_id), runtime.close(handle_id, True), runtime.interrupt(handle_id)]
    await asyncio.gather(*stops)
    for handle_id in handles:
        result = (await served.stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).result
        assert result.status in (pb.STATUS_INTERRUPTED, pb.STATUS_CLOSED), result
        view = (await served.stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).handle
        assert view.state == pb.HANDLE_STATE_CLOSED
