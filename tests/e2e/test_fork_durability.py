"""Forks across restarts: a server process on a SQLite file, killed (SIGKILL) and started again.
A fork made after the source's server restarted holds what the source held at the cut; its held
runs stay held through another restart (recovery continues what runs, not what a fork holds),
and a Wake then finishes them exactly."""

from __future__ import annotations

import signal

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import create, spawn, views
from tests.support.forks import LEAD, definitions, events, finish, last_seq, script
from tests.support.model_server import ScriptedModelServer
from tests.support.process import ServerProcess
from tests.support.tool_server import ToolServer


async def test_a_fork_made_across_restarts_stays_held_until_woken(
    process: ServerProcess, model: ScriptedModelServer, tools: ToolServer
) -> None:
    script(model)
    stub = await process.start()
    source = await create(stub, *definitions(tools))
    await spawn(stub, source, "lead")
    await stub.Wake(pb.WakeRequest(runtime_id=source, handle_id=LEAD, prompt="ship it"))
    recorded = await finish(stub, source)
    history = await events(stub, source, await last_seq(stub, source))

    await process.stop(signal.SIGKILL)
    stub = await process.restart()
    # The cut: the first worker's first fetch under way (started, no result): in doubt in the fork.
    started = next(e for e in history if e.WhichOneof("payload") == "tool_call_started" and e.handle_id.endswith("worker.1"))
    forked = await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=started.seq, runtime_id="after"))
    assert sorted(forked.held_handle_ids) == [LEAD, f"{LEAD}/worker.1"]

    calls, hits = sum(model.calls.values()), sum(tools.hits.values())
    await process.stop(signal.SIGKILL)
    stub = await process.restart()
    held = await views(stub, "after")
    assert {h: v.state for h, v in held.items()} == {LEAD: pb.HANDLE_STATE_HELD, f"{LEAD}/worker.1": pb.HANDLE_STATE_HELD}
    assert (sum(model.calls.values()), sum(tools.hits.values())) == (calls, hits)  # the restart ran nothing of it

    keys = len(tools.keys)
    result = await finish(stub, "after")
    assert (result.status, result.text, result.total_tokens) == (pb.STATUS_DONE, recorded.text, recorded.total_tokens)
    assert result.inherited_usage.total_tokens == 11 + 5  # the lead's first turn and the worker's
    assert tools.keys[keys].startswith("after/root/lead.1/worker.1/")  # the fetch in doubt, sent again under the fork's key
    assert (await stub.Wait(pb.WaitRequest(runtime_id=source, handle_id=LEAD))).result == recorded
