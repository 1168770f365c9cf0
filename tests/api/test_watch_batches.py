"""Watch with `batch`: the same events, in the same order, once each, in fewer responses; deltas
still one a response, in their place; a batch within the send limit; a watcher that resumes
from the last seq of a batch misses nothing (docs/streaming.md#batches)."""

from __future__ import annotations

from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.servers import serve

ROOT_DONE = ("root/lead.1", "result")


def lead(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("task", {"agent": "worker", "prompt": str(i)}) for i in range(3)], tokens=100)
    return Reply(text="all done", tokens=100)


def worker(body: dict[str, Any]) -> Reply:
    return Reply(text="worked " + "w" * 2_000, tokens=10)


async def _responses(stub: pb_grpc.AgentRuntimeAsyncStub, request: pb.WatchRequest) -> list[pb.WatchResponse]:
    """Responses until the root's result."""
    responses = []
    call = stub.Watch(request)
    async for response in call:
        responses.append(response)
        events = list(response.events) or ([response.event] if response.HasField("event") else [])
        if any((e.handle_id, e.WhichOneof("payload")) == ROOT_DONE for e in events):
            call.cancel()
            break
    return responses


async def _ran(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> str:
    model.script("lead", lead)
    model.script("worker", worker)
    runtime_id = await create(stub, agent("lead", team=["worker"]), agent("worker"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="lead"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    return runtime_id


async def test_a_batched_watch_sends_every_event_once_in_order_in_fewer_responses(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    runtime_id = await _ran(stub, model)
    live = await _responses(stub, pb.WatchRequest(runtime_id=runtime_id, batch=True))
    history = await _responses(stub, pb.WatchRequest(runtime_id=runtime_id, batch=True))
    one_each = await _responses(stub, pb.WatchRequest(runtime_id=runtime_id))
    events = [e.SerializeToString() for r in one_each for e in [r.event]]
    assert all(r.HasField("event") and not r.events for r in one_each)
    for batched in (live, history):
        assert all(r.events and not r.HasField("event") for r in batched)
        # (the root's result may share its batch with events after it)
        assert [e.SerializeToString() for r in batched for e in r.events][: len(events)] == events
    seqs = [e.seq for r in history for e in r.events]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 20
    assert len(history) < len(seqs) / 4  # the history comes in pages


async def test_batched_events_keep_their_place_among_deltas(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("lead", lead)
    model.script("worker", worker)
    runtime_id = await create(stub, agent("lead", team=["worker"]), agent("worker"))
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="lead"))).handle_id
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, deltas=True, batch=True))
    items: list[pb.Event | pb.Delta] = []
    woken = False
    async for response in call:
        if not woken:
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
            woken = True
        if response.HasField("delta"):
            assert not response.events
            items.append(response.delta)
            continue
        items.extend(response.events)
        if any((e.handle_id, e.WhichOneof("payload")) == ROOT_DONE for e in response.events):
            call.cancel()
            break
    # Each turn's text arrives whole in its deltas before its turn_ended, after its turn_started.
    for handle in {e.handle_id for e in items if isinstance(e, pb.Event) and e.HasField("turn_ended")}:
        started = [
            i for i, e in enumerate(items) if isinstance(e, pb.Event) and e.handle_id == handle and e.HasField("turn_started")
        ]
        ended = [i for i, e in enumerate(items) if isinstance(e, pb.Event) and e.handle_id == handle and e.HasField("turn_ended")]
        for begin, end in zip(started, ended, strict=True):
            text = "".join(d.text for d in items[begin:end] if isinstance(d, pb.Delta) and d.handle_id == handle)
            if handle.endswith(("worker.1", "worker.2", "worker.3")):
                assert text == "worked " + "w" * 2_000
    seqs = [e.seq for e in items if isinstance(e, pb.Event)]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_a_batch_stays_within_the_send_limit_and_resumes_after_its_last_seq(model: ScriptedModelServer) -> None:
    """A server whose limit is its least (256 KiB): three workers' 100 KiB results cannot share one response."""

    def big_worker(body: dict[str, Any]) -> Reply:
        return Reply(text="r" * 100_000, tokens=10)

    async with serve(llm_style="openai", llm_base_url=model.base_url, llm_api_key="k", max_message_bytes=256 << 10) as served:
        model.script("lead", lead)
        model.script("worker", big_worker)
        stub = served.stub
        runtime_id = await create(stub, agent("lead", team=["worker"]), agent("worker"))
        handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="lead"))).handle_id
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
        history = await _responses(stub, pb.WatchRequest(runtime_id=runtime_id, batch=True))
        assert all(r.ByteSize() <= 128 << 10 or len(r.events) == 1 for r in history)
        seqs = [e.seq for r in history for e in r.events]
        assert seqs == list(range(1, len(seqs) + 1))
        cut = history[len(history) // 2].events[-1].seq
        rest = await _responses(stub, pb.WatchRequest(runtime_id=runtime_id, after_seq=cut, batch=True))
        assert [e.seq for r in rest for e in r.events] == seqs[cut:]
