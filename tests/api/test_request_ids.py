"""Request ids (issue #29): every mutating call sent again with its request id takes effect
once and gets its first answer, even after a restart; the same id with another request is
INVALID_ARGUMENT REQUEST_ID_REUSED; refusals that did nothing say why and when to retry."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2

from tests.support.build import agent, create, status_details, views
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.scripts import relay_answer, relay_tool
from tests.support.servers import serve


def rid() -> str:
    return str(uuid.uuid4())


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def reused(error: grpc.aio.AioRpcError) -> bool:
    details = status_details(error)
    infos = [d for d in details if isinstance(d, error_details_pb2.ErrorInfo)]
    fields = [v.field for d in details if isinstance(d, error_details_pb2.BadRequest) for v in d.field_violations]
    return (
        error.code() == grpc.StatusCode.INVALID_ARGUMENT
        and [i.reason for i in infos] == ["REQUEST_ID_REUSED"]
        and fields == ["request_id"]
    )


async def test_each_mutating_call_sent_twice_takes_effect_once(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("worker", lambda body: Reply(text="done", tokens=7))
    model.script("asker", lambda body: Reply(calls=[("approve", {})], tokens=5) if len(body["messages"]) < 3 else Reply("ok"))
    runtime_id = await create(stub, agent("worker"), agent("asker", tools=[relay_tool("approve")]))

    spawn = pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="worker", request_id=rid())
    first, second = await stub.Spawn(spawn), await stub.Spawn(spawn)
    assert first == second == pb.SpawnResponse(handle_id="root/worker.1")
    assert list(await views(stub, runtime_id)) == ["root/worker.1"]
    other = pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="asker", request_id=spawn.request_id)
    assert reused(await refused(stub.Spawn(other)))

    post = pb.PostRequest(runtime_id=runtime_id, handle_id="root/worker.1", text="a note", request_id=rid())
    assert await stub.Post(post) == await stub.Post(post) == pb.PostResponse(ok=True, inbox_size=1)
    assert (await views(stub, runtime_id))["root/worker.1"].inbox_size == 1
    post.text = "another"
    assert reused(await refused(stub.Post(post)))

    wake = pb.WakeRequest(runtime_id=runtime_id, handle_id="root/worker.1", prompt="go", request_id=rid())
    answers = await asyncio.gather(stub.Wake(wake), stub.Wake(wake), stub.Wake(wake))  # at once, too
    assert list(answers) == [pb.WakeResponse(queued=True)] * 3
    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id="root/worker.1"))).result
    assert (result.status, result.turns, result.own_tokens) == (pb.STATUS_DONE, 1, 7)
    assert model.calls["worker"] == 1
    assert await stub.Wake(wake) == pb.WakeResponse(queued=True)  # settled since: still the first answer
    assert model.calls["worker"] == 1

    interrupt = pb.InterruptRequest(runtime_id=runtime_id, handle_id="root/worker.1", request_id=rid())
    assert await stub.Interrupt(interrupt) == await stub.Interrupt(interrupt) == pb.InterruptResponse(interrupted=False)

    asker = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="asker"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=asker, prompt="ask"))
    pending = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=asker))).result
    assert pending.status == pb.STATUS_PENDING
    resume = pb.ResumeRequest(runtime_id=runtime_id, answer=relay_answer(pending.pending, "yes"), request_id=rid())
    first_resume, second_resume = await stub.Resume(resume), await stub.Resume(resume)
    assert first_resume == second_resume
    assert (first_resume.result.status, first_resume.result.turns) == (pb.STATUS_DONE, 2)
    resume.answer.outputs[0].output = "no"
    assert reused(await refused(stub.Resume(resume)))

    close = pb.CloseRequest(runtime_id=runtime_id, handle_id="root", request_id=rid())
    closed = await stub.Close(close)
    assert list(closed.closed_handle_ids) == ["root/worker.1", asker]
    assert await stub.Close(close) == closed  # not [] (nothing left open): the first answer
    close.force = True
    assert reused(await refused(stub.Close(close)))
    assert reused(await refused(stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker", request_id=wake.request_id))))


async def test_create_and_delete_answer_again_for_their_tenant(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    make = pb.CreateRuntimeRequest(agents=[agent("solo")], request_id=rid())
    created = await stub.CreateRuntime(make)
    assert await stub.CreateRuntime(make) == created  # the id the server chose the first time
    runtimes = await stub.ListRuntimes(pb.ListRuntimesRequest())
    assert [r.runtime_id for r in runtimes.runtimes].count(created.runtime_id) == 1
    assert len(runtimes.runtimes) == 1
    make.agents[0].name = "duo"
    assert reused(await refused(stub.CreateRuntime(make)))

    delete = pb.DeleteRuntimeRequest(runtime_id=created.runtime_id, request_id=rid())
    assert await stub.DeleteRuntime(delete) == await stub.DeleteRuntime(delete) == pb.DeleteRuntimeResponse()
    plain = await refused(stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=created.runtime_id)))
    assert plain.code() == grpc.StatusCode.NOT_FOUND  # gone: only the repeat gets its first answer
    delete.force = True
    assert reused(await refused(stub.DeleteRuntime(delete)))
    make.agents[0].name = "solo"
    assert await stub.CreateRuntime(make) == created  # recorded per tenant: it outlives the runtime


async def test_a_request_id_of_a_runtimes_own_call_is_not_a_delete_of_it(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    """The id of a Spawn on the runtime (recorded in its journal), or of the CreateRuntime that
    made it, sent again with DeleteRuntime of that runtime is another call: REQUEST_ID_REUSED,
    and the runtime stays whole."""
    made = pb.CreateRuntimeRequest(agents=[agent("worker")], request_id=rid())
    runtime_id = (await stub.CreateRuntime(made)).runtime_id
    spawn = pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="worker", request_id=rid())
    assert (await stub.Spawn(spawn)).handle_id == "root/worker.1"
    for used in (spawn.request_id, made.request_id):
        assert reused(await refused(stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=runtime_id, request_id=used))))
        assert list(await views(stub, runtime_id)) == ["root/worker.1"]
    assert await stub.Spawn(spawn) == pb.SpawnResponse(handle_id="root/worker.1")  # its own answer still stands
    other = await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[agent("worker")]))
    # Another runtime's DeleteRuntime may use the id of this one's CreateRuntime: ids are per runtime.
    await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=other.runtime_id, request_id=made.request_id))
    await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=runtime_id, request_id=rid()))
    assert (await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes == []


async def test_a_request_id_is_checked_at_the_edge(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    runtime_id = await create(stub, agent("worker"))
    for bad in ("x" * 65, "has space", "ünï", "a/b", "a.b"):
        error = await refused(stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker", request_id=bad)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert [
            v.field for d in status_details(error) if isinstance(d, error_details_pb2.BadRequest) for v in d.field_violations
        ] == ["request_id"]
    assert await views(stub, runtime_id) == {}
    ok = "A" * 64
    assert (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker", request_id=ok))).handle_id == "root/worker.1"


async def test_a_refusal_records_nothing_and_the_same_id_may_act_later(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    """A call refused without an effect (here: the agent does not exist) keeps no answer: sent
    again once it can succeed, it acts (the caller never saw an answer that it acted on)."""
    runtime_id = await create(stub, agent("worker"))
    wake = pb.WakeRequest(runtime_id=runtime_id, handle_id="root/worker.1", prompt="go", request_id=rid())
    assert (await refused(stub.Wake(wake))).code() == grpc.StatusCode.NOT_FOUND
    await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker"))
    assert await stub.Wake(wake) == pb.WakeResponse(queued=True)


async def test_answers_survive_a_restart(tmp_path: Path, model: ScriptedModelServer) -> None:
    model.script("worker", lambda body: Reply(text="done", tokens=3))
    settings: dict[str, Any] = {"llm_style": "openai", "llm_base_url": model.base_url, "store": f"sqlite:///{tmp_path / 'a.db'}"}
    make = pb.CreateRuntimeRequest(agents=[agent("worker")], request_id=rid())
    async with serve(**settings) as served:
        runtime_id = (await served.stub.CreateRuntime(make)).runtime_id
        spawn = pb.SpawnRequest(runtime_id=runtime_id, agent="worker", request_id=rid())
        await served.stub.Spawn(spawn)
        wake = pb.WakeRequest(runtime_id=runtime_id, handle_id="root/worker.1", prompt="go", request_id=rid())
        await served.stub.Wake(wake)
        await served.stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id="root/worker.1"))
    async with serve(**settings) as served:
        assert (await served.stub.CreateRuntime(make)).runtime_id == runtime_id
        assert (await served.stub.Spawn(spawn)).handle_id == "root/worker.1"
        assert await served.stub.Wake(wake) == pb.WakeResponse(queued=True)
        listed = await views(served.stub, runtime_id)
        assert list(listed) == ["root/worker.1"] and listed["root/worker.1"].turns == 1
    assert model.calls["worker"] == 1


async def test_a_runtime_keeps_its_newest_answers(model: ScriptedModelServer) -> None:
    """AGENTRUNTIME_REQUEST_IDS_KEPT bounds a runtime's answers: the oldest goes first."""
    async with serve(llm_style="openai", llm_base_url=model.base_url, request_ids_kept=10) as served:
        runtime_id = await create(served.stub, agent("worker"))
        ids = [rid() for _ in range(11)]
        for request_id in ids:
            await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker", request_id=request_id))
        again = await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker", request_id=ids[-1]))
        assert again.handle_id == "root/worker.11"
        forgotten = await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker", request_id=ids[0]))
        assert forgotten.handle_id == "root/worker.12"  # its answer went first: a new spawn


async def test_a_draining_server_says_why_and_when_to_retry(model: ScriptedModelServer) -> None:
    model.script("slow", lambda body: Reply(text="done", delay=5))
    async with serve(llm_style="openai", llm_base_url=model.base_url) as served:
        runtime_id = await create(served.stub, agent("slow"))
        served.running.service.cache.draining = True
        error = await refused(served.stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[agent("slow")], request_id=rid())))
        served.running.service.cache.draining = False
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        details = status_details(error)
        assert [type(d).__name__ for d in details] == ["ErrorInfo", "RetryInfo"]
        assert details[0].reason == "SERVER_DRAINING" and details[0].domain == "agentruntime.dev"
        assert details[1].retry_delay.ToTimedelta().total_seconds() > 0
        assert runtime_id
