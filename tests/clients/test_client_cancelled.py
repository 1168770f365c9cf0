"""The Python client retries a CANCELLED the caller did not cause, like UNAVAILABLE, on every
call (a mutating one with the same request id, which makes the repeat safe), and never the
caller's own cancellation.

grpc-core answers a call that reached a server just as it began to shut down, before a
handler took it, with CANCELLED (grpc/grpc#41785): against our server, Watch and Wait calls
opened during a stop ended so within about 20 ms of it, their handler never run. Which calls
land in that window no test can order, so here a stand-in gRPC server on loopback answers
with that code where a stopping server would; the client under test is the real one."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest
from agentruntime.client import AgentRuntimeError, Client
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

DONE = pb.TaskResult(handle_id="root/a.1", status=pb.STATUS_DONE, turns=1, own_tokens=5, total_tokens=5)


class Stopping(pb_grpc.AgentRuntimeServicer):
    """Answers the first `cancelled` calls of each method CANCELLED, as a stopping server's
    grpc-core does, then as a server would."""

    def __init__(self, cancelled: int = 1) -> None:
        self.cancelled = cancelled
        self.calls: Counter[str] = Counter()
        self.watched_from: list[int] = []
        self.posted_ids: list[str] = []
        self.waiting = asyncio.Event()

    async def _maybe_cancel(self, method: str, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        self.calls[method] += 1
        if self.calls[method] <= self.cancelled:
            await context.abort(grpc.StatusCode.CANCELLED, "Cancelled")

    async def Wait(self, request: pb.WaitRequest, context: grpc.aio.ServicerContext) -> pb.WaitResponse:  # type: ignore[type-arg]
        await self._maybe_cancel("Wait", context)
        if request.handle_id == "root/slow.1":  # a Wait that waits (the caller cancels it)
            self.waiting.set()
            await asyncio.sleep(30)
        return pb.WaitResponse(result=DONE)

    async def Resume(self, request: pb.ResumeRequest, context: grpc.aio.ServicerContext) -> pb.ResumeResponse:  # type: ignore[type-arg]
        await self._maybe_cancel("Resume", context)
        return pb.ResumeResponse(result=DONE)

    async def Inspect(self, request: pb.InspectRequest, context: grpc.aio.ServicerContext) -> pb.InspectResponse:  # type: ignore[type-arg]
        await self._maybe_cancel("Inspect", context)
        return pb.InspectResponse(handle=pb.HandleView(handle_id=request.handle_id))

    async def Post(self, request: pb.PostRequest, context: grpc.aio.ServicerContext) -> pb.PostResponse:  # type: ignore[type-arg]
        self.posted_ids.append(request.request_id)
        await self._maybe_cancel("Post", context)
        return pb.PostResponse(inbox_size=1)

    async def Watch(
        self,
        request: pb.WatchRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[pb.WatchResponse]:
        """Each stream sends two events after `after_seq`, then is cut CANCELLED (a stop)."""
        self.calls["Watch"] += 1
        self.watched_from.append(request.after_seq)
        for seq in (request.after_seq + 1, request.after_seq + 2):
            yield pb.WatchResponse(event=pb.Event(seq=seq, handle_id="root/a.1"))
        await context.abort(grpc.StatusCode.CANCELLED, "Cancelled")


@pytest.fixture
async def stopping() -> AsyncIterator[tuple[Stopping, str]]:
    servicer = Stopping()  # type: ignore[abstract]  # the other RPCs stay UNIMPLEMENTED
    server = grpc.aio.server()
    pb_grpc.add_AgentRuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def _answer() -> pb.Answer:
    return pb.Answer(id="req-1", ok=True, outputs=[pb.ToolOutput(call_id="call_1", output="ok")])


async def test_wait_and_resume_are_retried_after_a_cancelled_from_the_server(stopping: tuple[Stopping, str]) -> None:
    servicer, address = stopping
    async with Client(address) as client:
        assert (await client.wait("rt", "root/a.1")).status == pb.STATUS_DONE
        assert (await client.resume("rt", _answer())).status == pb.STATUS_DONE
    assert (servicer.calls["Wait"], servicer.calls["Resume"]) == (2, 2)


async def test_a_cancelled_from_the_server_is_retried_on_a_read_and_on_a_post_with_its_request_id(
    stopping: tuple[Stopping, str],
) -> None:
    servicer, address = stopping
    async with Client(address) as client:
        assert (await client.inspect("rt", "root/a.1")).handle_id == "root/a.1"
        assert await client.post("rt", "root/a.1", "hello") == 1  # the repeat carries the first's request id
    assert (servicer.calls["Inspect"], servicer.calls["Post"]) == (2, 2)
    assert len(set(servicer.posted_ids)) == 1 and servicer.posted_ids[0]


async def test_a_cancelled_from_the_server_is_not_retried_with_retries_off(stopping: tuple[Stopping, str]) -> None:
    servicer, address = stopping
    async with Client(address, retries=False) as client:
        with pytest.raises(AgentRuntimeError) as refused:
            await client.post("rt", "root/a.1", "hello")
    assert refused.value.code is grpc.StatusCode.CANCELLED
    assert servicer.calls["Post"] == 1


async def test_a_watch_cut_cancelled_by_the_server_reconnects_from_its_last_seq(stopping: tuple[Stopping, str]) -> None:
    servicer, address = stopping
    seqs: list[int] = []
    async with Client(address) as client:
        async for event in client.watch("rt", backoff=0.01):
            seqs.append(event.seq)
            if len(seqs) == 6:
                break
    assert seqs == [1, 2, 3, 4, 5, 6]  # no gap, nothing twice
    assert servicer.watched_from == [0, 2, 4]


async def test_the_callers_own_cancellation_is_not_retried(stopping: tuple[Stopping, str]) -> None:
    servicer, address = stopping
    servicer.cancelled = 0
    async with Client(address) as client:
        waiting = asyncio.ensure_future(client.wait("rt", "root/slow.1"))
        await asyncio.wait_for(servicer.waiting.wait(), 10)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0.3)  # a retry would have reached the server by now
    assert servicer.calls["Wait"] == 1
