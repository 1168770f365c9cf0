"""Watch with deltas: what the models write, as they write it (docs/streaming.md), on the wire:
Delta messages joined to the transcript and ordered among events, Watch without deltas, a
scripted stream out of range refused. How watchers get deltas (late, reconnected, children,
resets, never contradicting the journal) is the fast tier's: tests/domain/test_deltas.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, duration, spawn, status_details, transcript, wait
from tests.support.deltas import joined, watch

DELEGATE = '{"agent": "worker", "prompt": "go"}'
TEXT = "Streaming lets a person read an answer while the model is still writing it."


def streamed(text: str = TEXT, chunk: int = 8, pause: float = 0.02) -> pb.Script:
    return pb.Script(replies=[pb.ScriptedReply(text=text, tokens=19, stream_chunk_chars=chunk, stream_pause=duration(pause))])


async def test_a_scripted_reply_streams_in_pieces_that_join_to_the_transcript(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    runtime_id = await create(stub, agent("writer", script=streamed()))
    handle_id = await spawn(stub, runtime_id, "writer")
    watching = asyncio.ensure_future(watch(stub, runtime_id, handle_id))
    await asyncio.sleep(0.1)  # the watcher is subscribed before the turn starts (else the turn is not streamed)
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="write"))
    watched = await watching

    pieces = watched.of(handle_id)
    assert [d.index for d in pieces] == list(range(10))
    assert all(d.WhichOneof("piece") == "text" and d.turn == 1 for d in pieces)
    assert [len(d.text) for d in pieces] == [8] * 9 + [3]
    assert joined(pieces) == TEXT
    messages = await transcript(stub, runtime_id, handle_id)
    assert messages[-1].content == TEXT
    assert watched.result is not None and watched.result.text == TEXT
    # The turn's TurnEnded follows its last delta, and each delta names the event before it.
    kinds = ["delta" if r.HasField("delta") else r.event.WhichOneof("payload") for r in watched.responses]
    started = kinds.index("turn_started")
    assert kinds[started + 1 : started + 11] == ["delta"] * 10 and kinds[started + 11] == "turn_ended"
    turn_started_seq = watched.events[[e.WhichOneof("payload") for e in watched.events].index("turn_started")].seq
    assert {d.after_seq for d in pieces} == {turn_started_seq}


async def test_a_watcher_without_deltas_sees_todays_stream(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    runtime_id = await create(stub, agent("writer", script=streamed()))
    handle_id = await spawn(stub, runtime_id, "writer")
    with_deltas = asyncio.ensure_future(watch(stub, runtime_id, handle_id))
    await asyncio.sleep(0.1)
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="write"))
    await wait(stub, runtime_id, handle_id)
    await with_deltas
    plain = []
    async for response in stub.Watch(pb.WatchRequest(runtime_id=runtime_id), timeout=10):
        assert not response.HasField("delta")
        plain.append(response.event)
        if response.event.HasField("result"):
            break
    assert [e.seq for e in plain] == list(range(1, len(plain) + 1))


async def test_a_scripted_stream_out_of_range_is_refused_with_its_field(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    bad = pb.Script(
        replies=[
            pb.ScriptedReply(text="x", stream_chunk_chars=-1),
            pb.ScriptedReply(text="x", stream_chunk_chars=100_001, stream_pause=duration(61)),
        ]
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, agent("writer", script=bad))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    fields = {v.field for detail in status_details(refused.value) for v in getattr(detail, "field_violations", [])}
    assert fields == {
        "agents[0].script.replies[0].stream_chunk_chars",
        "agents[0].script.replies[1].stream_chunk_chars",
        "agents[0].script.replies[1].stream_pause",
    }
    listed = await stub.ListRuntimes(pb.ListRuntimesRequest())
    assert not listed.runtimes  # nothing was created
