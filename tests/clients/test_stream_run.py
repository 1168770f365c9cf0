"""The Python client's stream-run helper over a real server: the handle's deltas as its scripted
reply streams, each once and in order, joined equal to the result's text; another handle's
pieces are not handed over; a provider's first turn streams too (the Wake follows the Watch),
and a provider call cut mid-stream comes as a `retry` reset; a Watch cut mid-turn is reopened
and the turn's pieces already handed over are not handed over again; the blocking client
gives the same."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from agentruntime.client import Client
from agentruntime.sync import SyncClient
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, duration
from tests.support.deltas import joined
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.servers import Served, serve
from tests.support.sse import Streamed

TEXT = "Streaming lets a person read an answer while the model is still writing it."


def writer(name: str = "writer", text: str = TEXT, pause: float = 0.02) -> pb.AgentDef:
    reply = pb.ScriptedReply(text=text, tokens=19, stream_chunk_chars=8, stream_pause=duration(pause))
    return agent(name, script=pb.Script(replies=[reply]))


@pytest.fixture
async def scripted() -> AsyncIterator[Served]:
    """A server on the embedded scripted model: the agents' replies are their scripts."""
    async with serve() as served:
        yield served


async def streamed(items: AsyncIterator[pb.Delta | pb.TaskResult]) -> tuple[list[pb.Delta], pb.TaskResult]:
    """Every delta the helper handed over, and the result it ended with (nothing after it)."""
    deltas: list[pb.Delta] = []
    async for item in items:
        if isinstance(item, pb.TaskResult):
            with pytest.raises(StopAsyncIteration):
                await anext(items)
            return deltas, item
        deltas.append(item)
    raise AssertionError(f"the helper ended without a result after {len(deltas)} deltas")


async def test_stream_run_hands_over_the_handles_pieces_that_join_to_its_result(scripted: Served) -> None:
    async with Client(f"127.0.0.1:{scripted.running.port}") as client:
        runtime_id = await client.create_runtime([writer(), writer("other", "someone else's words, not ours")])
        # Another handle streams at the same time: its pieces are on the same Watch, not handed over.
        other = await client.spawn(runtime_id, "other")
        await client.wake(runtime_id, other, "write too")
        deltas, result = await asyncio.wait_for(streamed(client.stream_run(runtime_id, "writer", "write it")), 60)

    assert {delta.handle_id for delta in deltas} == {"root/writer.1"}
    assert [(delta.turn, delta.index) for delta in deltas] == [(1, index) for index in range(10)]
    assert [delta.WhichOneof("piece") for delta in deltas] == ["text"] * 10
    assert (result.handle_id, result.status, result.turns, result.total_tokens) == ("root/writer.1", pb.STATUS_DONE, 1, 19)
    assert joined(deltas) == result.text == TEXT


async def test_a_providers_turn_streams_and_a_call_cut_mid_stream_comes_as_a_reset(model: ScriptedModelServer) -> None:
    attempts: list[int] = []

    def script(body: dict[str, Any]) -> Reply:
        attempts.append(1)  # the first call is cut after its fifth event; the second is whole
        return Reply(text=TEXT, tokens=30, streamed=Streamed(chunk=10, pause=0.05, cut_after=5 if len(attempts) == 1 else None))

    model.script("writer", script)
    async with (
        serve(llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", llm_backoff_base=0.01) as served,
        Client(f"127.0.0.1:{served.running.port}") as client,
    ):
        runtime_id = await client.create_runtime([agent("writer")])
        deltas, result = await asyncio.wait_for(streamed(client.stream_run(runtime_id, "writer", "write it")), 60)

    pieces = [delta.WhichOneof("piece") for delta in deltas]
    # A provider's turn streams only to the watchers there when it starts: the Wake came after the Watch.
    assert pieces.count("reset") == 1 and pieces[0] == "text", pieces
    reset = deltas[pieces.index("reset")]
    assert (reset.index, reset.reset.reason) == (0, "retry") and len(attempts) == 2
    after = deltas[pieces.index("reset") + 1 :]
    assert [delta.index for delta in after] == list(range(1, len(after) + 1))
    assert joined(deltas) == result.text == TEXT and result.status == pb.STATUS_DONE


class CutFirstWatch(grpc.aio.UnaryStreamClientInterceptor):
    """Drops the first Watch with deltas after `after` deltas, as a proxy cutting it mid-turn
    would (UNAVAILABLE); the client's reconnect and the server's resend are the real ones."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.cut = False

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        if self.cut or not isinstance(request, pb.WatchRequest) or not request.deltas:
            return call
        self.cut = True
        return self._cutting(call)

    async def _cutting(self, call: Any) -> AsyncIterator[pb.WatchResponse]:
        deltas = 0
        async for response in call:
            yield response
            deltas += response.HasField("delta")
            if deltas == self.after:
                call.cancel()
                empty = grpc.aio.Metadata()
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "cut by the test mid-turn")


async def test_a_watch_cut_mid_turn_is_reopened_and_each_piece_handed_over_once(scripted: Served) -> None:
    cutter = CutFirstWatch(after=4)
    async with Client(f"127.0.0.1:{scripted.running.port}", interceptors=[cutter]) as client:
        runtime_id = await client.create_runtime([writer(pause=0.1)])  # a turn of a second: the reconnect is mid-turn
        items = client.stream_run(runtime_id, "writer", "write it", backoff=0.01)
        deltas, result = await asyncio.wait_for(streamed(items), 60)

    assert cutter.cut
    # The server sent the turn again from index 0 after the reconnect: the first four were skipped.
    assert [delta.index for delta in deltas] == list(range(10))
    assert joined(deltas) == result.text == TEXT


async def test_the_sync_client_streams_a_run_too(scripted: Served) -> None:
    address = f"127.0.0.1:{scripted.running.port}"

    def script() -> list[pb.Delta | pb.TaskResult]:
        with SyncClient(address) as client:
            runtime_id = client.create_runtime([writer()])
            return list(client.stream_run(runtime_id, "writer", "write it"))

    items = await asyncio.to_thread(script)  # in a thread: the server runs on this test's loop
    *deltas, result = items
    assert all(isinstance(item, pb.Delta) for item in deltas)
    assert isinstance(result, pb.TaskResult) and result.status == pb.STATUS_DONE
    assert "".join(delta.text for delta in deltas if isinstance(delta, pb.Delta)) == result.text == TEXT
