"""A budget that asks, over the wire: its `budget` Request (kind, data) in Wait's result, a
Resume whose Struct data extends it (the handle's budget in Inspect), the same answer again
answered the same, an extension no budget field can take refused with INVALID_ARGUMENT naming
its field, and a declining answer stopping the run. What budgets do (carving, live checks up
the ancestor chain, asking, tool calls counted from their start, QUEUED under max_concurrent)
is the fast tier's: tests/domain/test_budget_limits.py and test_budget_reservations.py."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, create, http_tool, spawn, struct, wait
from tests.support.calls import Stub, bad_request_fields, handle_view, resume, wake
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.tool_server import ToolServer


def probe_script(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("probe", {"what": "disk"})], tokens=10)
    return Reply(text="finished", tokens=10)


def asking(max_turns: int) -> pb.Budget:
    return pb.Budget(on_exhausted=pb.ON_EXHAUSTED_ASK, max_turns=max_turns)


async def test_a_turn_budget_that_asks_is_extended_declined_or_refused(
    stub: Stub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    model.script("prober", probe_script)
    runtime_id = await create(stub, agent("prober", tools=[http_tool("probe", tools.url("probe"))]))
    handle_id = await spawn(stub, runtime_id, "prober", asking(max_turns=1))
    await wake(stub, runtime_id, handle_id, "probe")
    pending = await wait(stub, runtime_id, handle_id)
    request = pending.pending
    assert (pending.status, request.kind, request.data["limit"]) == (pb.STATUS_PENDING, "budget", "LIMIT_MAX_TURNS")
    assert (pending.turns, tools.hits["probe"]) == (1, 1)

    answer = pb.Answer(id=request.id, ok=True, data=struct({"extend": {"max_turns": 3}}))
    done = await resume(stub, runtime_id, answer)
    assert (done.status, done.text, done.turns) == (pb.STATUS_DONE, "finished", 2)
    assert (await handle_view(stub, runtime_id, handle_id)).budget.max_turns == 3
    again = await resume(stub, runtime_id, answer)
    assert again == done
    assert (model.calls["prober"], tools.hits["probe"]) == (2, 1)

    # Refused before any change: a field that is not a budget's, a negative figure.
    declined_id = await spawn(stub, runtime_id, "prober", asking(max_turns=1))
    await wake(stub, runtime_id, declined_id, "probe")
    request = (await wait(stub, runtime_id, declined_id)).pending
    for extend in ({"max_bananas": 2}, {"max_turns": -1}):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await resume(stub, runtime_id, pb.Answer(id=request.id, ok=True, data=struct({"extend": extend})))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        [where] = bad_request_fields(bad.value)
        [name] = extend
        assert where.startswith("answer.data.extend.") and name in where, where
        if name == "max_turns":
            assert where == "answer.data.extend.max_turns"
    assert (await handle_view(stub, runtime_id, declined_id)).state == pb.HANDLE_STATE_SUSPENDED

    stopped = await resume(stub, runtime_id, pb.Answer(id=request.id, ok=False, reason="enough"))
    assert (stopped.status, stopped.limit, stopped.turns) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TURNS, 1)
    assert (await handle_view(stub, runtime_id, declined_id)).state == pb.HANDLE_STATE_IDLE
