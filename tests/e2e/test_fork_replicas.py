"""A fork on PostgreSQL, asked of a replica that does not run the source: it reads the source's
journal from the database as acknowledged (no lease taken, nothing written to it), makes and
runs the fork itself, and the owner goes on with the source undisturbed."""

from __future__ import annotations

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import create, spawn
from tests.support.forks import LEAD, definitions, events, finish, script
from tests.support.model_server import ScriptedModelServer
from tests.support.replicas import Pair, pair
from tests.support.tool_server import ToolServer

__all__ = ["pair"]  # a fixture of tests/support/replicas.py, used here


async def test_a_replica_forks_a_runtime_another_replica_runs(pair: Pair, model: ScriptedModelServer, tools: ToolServer) -> None:
    script(model)
    owner = await pair.owner.start()
    other = await pair.other.start()
    source = await create(owner, *definitions(tools))
    await spawn(owner, source, "lead")
    await owner.Wake(pb.WakeRequest(runtime_id=source, handle_id=LEAD, prompt="ship it"))
    pending = (await owner.Wait(pb.WaitRequest(runtime_id=source, handle_id=LEAD), timeout=60)).result
    assert (pending.status, pending.pending.kind) == (pb.STATUS_PENDING, "approval")  # the owner holds it, suspended
    history = await events(owner, source, 37)
    assert history[-1].WhichOneof("payload") == "state_changed"

    forked = await other.ForkRuntime(
        pb.ForkRuntimeRequest(
            source_runtime_id=source, at_seq=37, answers=[pb.Answer(id=pending.pending.id, ok=False, reason="denied")]
        ),
        timeout=30,
    )
    hits = dict(tools.hits)
    result = await finish(other, forked.runtime_id)
    assert (result.status, result.text) == (pb.STATUS_DONE, "lead done")
    assert tools.hits == hits  # the commit denied in the fork never ran
    # The owner's runtime is as it was: still pending, and it finishes the source's own way.
    assert (await owner.Wait(pb.WaitRequest(runtime_id=source, handle_id=LEAD), timeout=60)).result == pending
    done = await finish(owner, source)
    assert (done.status, tools.hits["commit"]) == (pb.STATUS_DONE, hits.get("commit", 0) + 1)
    assert done.total_tokens == result.total_tokens == 94
