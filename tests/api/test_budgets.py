"""A budget that asks can only be extended past what is used: an extension that leaves the
exhausted field where it is (another field named, or an ancestor's budget capping it) is
refused, so the run never asks the same question again in a loop."""

from __future__ import annotations

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2

from tests.support.build import create, status_details, struct

ASKER = pb.AgentDef(
    name="asker",
    budget=pb.Budget(max_turns=1, on_exhausted=pb.ON_EXHAUSTED_ASK),
    script=pb.Script(
        replies=[
            pb.ScriptedReply(tool_calls=[pb.ScriptedToolCall(name="ask", arguments_json='{"question": "go on?"}')], tokens=5),
            pb.ScriptedReply(text="done", tokens=5),
        ]
    ),
)


async def _pending(stub: pb_grpc.AgentRuntimeStub) -> tuple[str, str, pb.Request]:
    runtime_id = await create(stub, ASKER)
    handle = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="asker"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle, prompt="go"))
    first = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle))).result
    assert first.pending.kind == "input"  # the ask tool, within the one turn
    answered = await stub.Resume(
        pb.ResumeRequest(runtime_id=runtime_id, answer=pb.Answer(id=first.pending.id, ok=True, data=struct({"a": "yes"})))
    )
    assert answered.result.status == pb.STATUS_PENDING and answered.result.pending.kind == "budget"
    return runtime_id, handle, answered.result.pending


async def test_an_extension_of_another_field_is_refused_and_changes_nothing(stub: pb_grpc.AgentRuntimeStub) -> None:
    runtime_id, handle, request = await _pending(stub)
    assert request.data["field"] == "max_turns"
    wrong = pb.Answer(id=request.id, ok=True, data=struct({"extend": {"max_tokens": 1000}}))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=wrong))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [bad] = [d for d in status_details(refused.value) if isinstance(d, error_details_pb2.BadRequest)]
    assert [v.field for v in bad.field_violations] == ["answer.data.extend.max_turns"]
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle))).handle
    assert (view.state, view.pending_kind) == (pb.HANDLE_STATE_SUSPENDED, "budget")
    right = pb.Answer(id=request.id, ok=True, data=struct({"extend": {"max_turns": 2}}))
    done = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=right))).result
    assert (done.status, done.text, done.turns) == (pb.STATUS_DONE, "done", 2)
