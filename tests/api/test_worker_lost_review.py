"""A worker call in doubt whose retry no worker takes (found by tests/test_worker_hunt.py).

The README: a worker that disconnects, or misses the deadline, with a call in hand leaves the
call in doubt, and RETRY gives it to another worker. When no other worker takes it within its
timeout, the result must still say that a worker took the call and it may or may not have
taken effect: "no worker took the call" would tell the model the call never ran, and invite
it to make the call again under a new key (a second charge)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.api.test_workers import calls_then_answer, serving, worker_tool
from tests.support.build import agent, create, spawn, transcript, wait
from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.servers import Served


async def _lost_call_result(served: Served, model: ScriptedModelServer, timeout: float, leave_when_kept: bool) -> tuple[str, str]:
    """A worker takes the call and hangs; it leaves (at once, or once the call was kept past its
    deadline); no other worker comes. The call's result, and the worker's id."""
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    runtime_id = await create(served.stub, agent("payer", tools=[worker_tool("charge", timeout=timeout)]))
    held: list[str] = []
    ids: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        held.append(call.call.idempotency_key)
        await asyncio.sleep(3600)
        return "never"

    pool = served.running.workers
    async with Client(f"127.0.0.1:{served.port}") as client:
        async with serving(client, "tools", {"charge": hangs}) as ids:
            handle_id = await spawn(served.stub, runtime_id, "payer")
            await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
            await until(lambda: bool(held), "the worker to hold the call")
            if leave_when_kept:
                [worker] = [w for workers in pool._queues.values() for w in workers]  # type: ignore[union-attr]
                await until(lambda: held[0] in worker.missed, "the call to be kept past its deadline", timeout=10)
        # The worker is gone with the call; the retry waits for another one, and none comes.
        result = await wait(served.stub, runtime_id, handle_id)
    assert result.status == pb.STATUS_DONE, result
    [tool_message] = [m for m in await transcript(served.stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error
    return tool_message.content, ids[0]


async def test_a_call_whose_worker_went_away_and_no_other_took_says_it_may_have_taken_effect(
    served: Served, model: ScriptedModelServer
) -> None:
    output, worker_id = await _lost_call_result(served, model, 0.5, leave_when_kept=False)
    assert "no worker of queue" not in output, output
    assert output == (
        f"worker {worker_id} of queue 'tools' took the call and went away without answering, and no other "
        "worker took it within 0.5s: it may or may not have taken effect"
    ), output


async def test_a_call_kept_past_its_deadline_by_a_worker_that_then_left_says_it_may_have_taken_effect(
    served: Served, model: ScriptedModelServer
) -> None:
    output, worker_id = await _lost_call_result(served, model, 1.0, leave_when_kept=True)
    assert "no worker of queue" not in output, output
    assert output == (
        f"worker {worker_id} of queue 'tools' took the call and went away without answering, and no other "
        "worker took it within 1s: it may or may not have taken effect"
    ), output


async def test_a_call_in_doubt_again_after_the_host_had_it_run_again_asks_with_a_new_request(
    served: Served, model: ScriptedModelServer
) -> None:
    """ASK: a worker goes away with the call, the host answers `ok` without an output (run it
    again), and the next worker goes away with it too. The second in_doubt Request must not
    reuse the first one's id: a retry of the first Resume (its reply lost on the way) would be
    read as an answer to the second, and run the call a third time; the README says a retried
    Resume returns the same result and runs nothing."""
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    charge = worker_tool("charge", timeout=5, on_interrupted=pb.ON_INTERRUPTED_ASK)
    runtime_id = await create(served.stub, agent("payer", tools=[charge]))
    held: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        held.append(call.call.idempotency_key)
        await asyncio.sleep(3600)
        return "never"

    async with Client(f"127.0.0.1:{served.port}") as client:
        async with serving(client, "tools", {"charge": hangs}):
            handle_id = await spawn(served.stub, runtime_id, "payer")
            await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
            await until(lambda: len(held) == 1, "the first worker to hold the call")
        first = await wait(served.stub, runtime_id, handle_id)
        assert (first.status, first.pending.kind) == (pb.STATUS_PENDING, "in_doubt"), first
        rerun = pb.ResumeRequest(runtime_id=runtime_id, answer=pb.Answer(id=first.pending.id, ok=True))
        async with serving(client, "tools", {"charge": hangs}):
            resuming = asyncio.ensure_future(served.stub.Resume(rerun, timeout=30))
            await until(lambda: len(held) == 2, "the second worker to hold the call")
        second = (await resuming).result
        assert (second.status, second.pending.kind) == (pb.STATUS_PENDING, "in_doubt"), second
        assert second.pending.id != first.pending.id, second.pending.id
        # The host retries its first Resume: the same result, and the call is not run again.
        async with serving(client, "tools", {"charge": hangs}):
            retried = (await served.stub.Resume(rerun, timeout=30)).result
            assert (retried.status, retried.pending.id) == (pb.STATUS_PENDING, second.pending.id), retried
            assert len(held) == 2, held
            # The second Request, answered with an output, settles the call.
            output = pb.ToolOutput(call_id=second.pending.calls[0].id, output="it went through")
            answer = pb.Answer(id=second.pending.id, ok=True, outputs=[output])
            done = (await served.stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer), timeout=30)).result
    assert (done.status, done.text) == (pb.STATUS_DONE, "it went through"), done
    assert held == [f"{runtime_id}/{handle_id}/call_1_1"] * 2
