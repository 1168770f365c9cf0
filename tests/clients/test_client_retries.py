"""The Python client's retries and request ids, against a stand-in AgentRuntime server on
loopback that refuses the first N attempts with the status a test chooses and records every
attempt (its method, its request id, when it came).

What is retried: UNAVAILABLE, CANCELLED from the server, an attempt's own deadline, and any
status that carries google.rpc.RetryInfo (waiting at least its retry_delay); with backoff and
full jitter, for a run of failures of at most the retry window. A mutating call carries one
request id, the caller's or a fresh UUID, on every attempt. Nothing else is retried, nor
anything after the caller cancels, nor anything at all with `retries=False`. The real server's
side (a repeat returns the first answer) is the conformance vector s_request_ids."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from agentruntime.client import AgentRuntimeError, Client
from agentruntime.sync import SyncClient
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from tests.support.poll import until

DONE = pb.TaskResult(handle_id="root/a.1", status=pb.STATUS_DONE, turns=1, own_tokens=5, total_tokens=5)
ANSWER = pb.Answer(id="req-1", ok=True)

# The canned answer of each unary RPC, once the stand-in stops refusing.
ANSWERS: dict[str, Callable[[Any], Any]] = {
    "CreateRuntime": lambda request: pb.CreateRuntimeResponse(runtime_id=request.runtime_id or "rt-made"),
    "Spawn": lambda request: pb.SpawnResponse(handle_id=f"{request.parent_id}/{request.agent}.1"),
    "Post": lambda request: pb.PostResponse(ok=True, inbox_size=1),
    "Wake": lambda request: pb.WakeResponse(queued=False),
    "Wait": lambda request: pb.WaitResponse(result=DONE),
    "Resume": lambda request: pb.ResumeResponse(result=DONE),
    "Interrupt": lambda request: pb.InterruptResponse(interrupted=True),
    "Close": lambda request: pb.CloseResponse(closed_handle_ids=[request.handle_id]),
    "Inspect": lambda request: pb.InspectResponse(handle=pb.HandleView(handle_id=request.handle_id)),
    "List": lambda request: pb.ListResponse(handles=[pb.HandleView(handle_id="root/a.1")]),
    "GetTranscript": lambda request: pb.GetTranscriptResponse(messages=[pb.Message(role="user", content="hi")]),
    "ListRuntimes": lambda request: pb.ListRuntimesResponse(runtimes=[pb.RuntimeSummary(runtime_id="rt")]),
    "DeleteRuntime": lambda request: pb.DeleteRuntimeResponse(),
    "ForkRuntime": lambda request: pb.ForkRuntimeResponse(
        runtime_id=request.runtime_id or "rt-fork", fork_seq=request.at_seq, held_handle_ids=["root/a.1"]
    ),
    "ReplayRuntime": lambda request: pb.ReplayRuntimeResponse(runtime_id=request.runtime_id or "rt-replay", settled=True),
}

# Each mutating method of the client, called with a request id (None: the client's own).
MUTATING: dict[str, Callable[[Client, str | None], Awaitable[Any]]] = {
    "CreateRuntime": lambda client, request_id: client.create_runtime([], request_id=request_id),
    "Spawn": lambda client, request_id: client.spawn("rt", "a", request_id=request_id),
    "Post": lambda client, request_id: client.post("rt", "root/a.1", "a note", request_id=request_id),
    "Wake": lambda client, request_id: client.wake("rt", "root/a.1", "go", request_id=request_id),
    "Resume": lambda client, request_id: client.resume("rt", ANSWER, request_id=request_id),
    "Interrupt": lambda client, request_id: client.interrupt("rt", "root/a.1", request_id=request_id),
    "Close": lambda client, request_id: client.close("rt", "root/a.1", request_id=request_id),
    "DeleteRuntime": lambda client, request_id: client.delete_runtime("rt", request_id=request_id),
    "ForkRuntime": lambda client, request_id: client.fork_runtime("rt", 3, request_id=request_id),
    "ReplayRuntime": lambda client, request_id: client.replay_runtime("rt", request_id=request_id),
}

# Each read of the client.
READS: dict[str, Callable[[Client], Awaitable[Any]]] = {
    "Wait": lambda client: client.wait("rt", "root/a.1"),
    "Inspect": lambda client: client.inspect("rt", "root/a.1"),
    "List": lambda client: client.list_handles("rt"),
    "GetTranscript": lambda client: client.transcript("rt", "root/a.1"),
    "ListRuntimes": lambda client: client.list_runtimes(),
}


def refusal(code: grpc.StatusCode, message: str, *, reason: str = "", retry_delay: float | None = None) -> grpc.Status:
    """A status as the server sends it: google.rpc details ErrorInfo (with `reason`) and
    RetryInfo (with `retry_delay` seconds), each only when given."""
    details = []
    if reason:
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="agentruntime.dev"))
        details.append(info)
    if retry_delay is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_delay * 1e9))
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    status: grpc.Status = rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=details))
    return status


UNAVAILABLE = refusal(grpc.StatusCode.UNAVAILABLE, "the server is restarting")


@dataclass
class Attempt:
    method: str
    request_id: str
    at: float  # the stand-in's loop time


class Flaky(pb_grpc.AgentRuntimeServicer):
    """Holds the next `holds` attempts for a minute (an attempt that times out, or a call the
    caller cancels); answers the next attempts as `plan` says (a grpc.Status refuses, a
    message is the answer); refuses the next `failures` attempts (of any method) with
    `status` (None: for ever); then answers as ANSWERS says. Every attempt is in `attempts`."""

    def __init__(self) -> None:
        self.status = UNAVAILABLE
        self.failures: int | None = 0
        self.holds = 0
        self.plan: list[Any] = []
        self.attempts: list[Attempt] = []

    def refuse(self, failures: int | None, status: grpc.Status = UNAVAILABLE) -> None:
        self.failures, self.status = failures, status

    def of(self, method: str) -> list[Attempt]:
        return [attempt for attempt in self.attempts if attempt.method == method]

    async def answer(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
        self.attempts.append(Attempt(method, getattr(request, "request_id", ""), asyncio.get_running_loop().time()))
        if self.holds:
            self.holds -= 1
            await asyncio.sleep(60)
        if self.plan:
            step = self.plan.pop(0)
            if isinstance(step, grpc.Status):
                await context.abort_with_status(step)
            return step
        if self.failures is None or self.failures > 0:
            if self.failures is not None:
                self.failures -= 1
            await context.abort_with_status(self.status)
        return ANSWERS[method](request)

    async def Watch(
        self,
        request: pb.WatchRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[pb.WatchResponse]:
        """One event after `after_seq` (unless refused), then the stream is cut with the status."""
        self.attempts.append(Attempt("Watch", "", asyncio.get_running_loop().time()))
        if self.failures is not None and self.failures > 0:
            self.failures -= 1
        elif self.failures is not None:
            yield pb.WatchResponse(event=pb.Event(seq=request.after_seq + 1, handle_id="root/a.1"))
        await context.abort_with_status(self.status)


def _unary(method: str) -> Callable[..., Awaitable[Any]]:
    async def handler(self: Flaky, request: Any, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
        return await self.answer(method, request, context)

    return handler


for _method in ANSWERS:
    setattr(Flaky, _method, _unary(_method))


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[Flaky, str]]:
    # The generated .pyi marks every servicer method abstract; at run time the base answers
    # UNIMPLEMENTED (ServeTools here) and the unary methods are the ones set above.
    servicer = Flaky()  # type: ignore[abstract]
    server = grpc.aio.server()
    pb_grpc.add_AgentRuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def _is_uuid4(text: str) -> bool:
    try:
        return uuid.UUID(text).version == 4 and str(uuid.UUID(text)) == text
    except ValueError:
        return False


# ---- (a) one request id on every attempt ------------------------------------------------------


@pytest.mark.parametrize("method", list(MUTATING))
async def test_a_mutating_call_sends_one_fresh_request_id_on_every_attempt(flaky: tuple[Flaky, str], method: str) -> None:
    servicer, address = flaky
    async with Client(address) as client:
        servicer.refuse(2)
        await MUTATING[method](client, None)
        first = [attempt.request_id for attempt in servicer.of(method)]
        servicer.refuse(1)
        await MUTATING[method](client, None)
        second = [attempt.request_id for attempt in servicer.of(method)][3:]
    assert len(first) == 3 and len(set(first)) == 1 and _is_uuid4(first[0]), first
    assert len(second) == 2 and len(set(second)) == 1 and _is_uuid4(second[0]), second
    assert first[0] != second[0]  # one id per call, not per client


@pytest.mark.parametrize("method", list(MUTATING))
async def test_a_mutating_call_sends_the_callers_request_id_on_every_attempt(flaky: tuple[Flaky, str], method: str) -> None:
    servicer, address = flaky
    servicer.refuse(2)
    async with Client(address) as client:
        await MUTATING[method](client, f"mine-{method}")
    assert [attempt.request_id for attempt in servicer.attempts] == [f"mine-{method}"] * 3


async def test_run_sends_its_spawn_and_wake_ids(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    async with Client(address) as client:
        servicer.refuse(1)
        assert await client.run("rt", "a", "go", spawn_request_id="s-1", wake_request_id="w-1") == DONE
        given = [(attempt.method, attempt.request_id) for attempt in servicer.attempts]
        servicer.attempts.clear()
        servicer.refuse(1)
        assert await client.run("rt", "a", "go") == DONE
    assert given == [("Spawn", "s-1"), ("Spawn", "s-1"), ("Wake", "w-1"), ("Wait", "")]
    spawned, again, woken, waited = servicer.attempts
    assert (spawned.method, again.method, woken.method, waited.method) == ("Spawn", "Spawn", "Wake", "Wait")
    assert spawned.request_id == again.request_id != woken.request_id  # one id for each call, kept across its attempts
    assert _is_uuid4(spawned.request_id) and _is_uuid4(woken.request_id)


async def test_call_sends_any_request_with_a_request_id_and_leaves_the_callers_message_alone(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    post = pb.PostRequest(runtime_id="rt", handle_id="root/a.1", text="hi", trust=pb.TRUST_EXTERNAL)
    async with Client(address) as client:
        servicer.refuse(1)
        assert await client.call("Post", post) == pb.PostResponse(ok=True, inbox_size=1)
        await client.call("Close", pb.CloseRequest(runtime_id="rt", handle_id="root/a.1", request_id="close-1"))
        inspected = await client.call("Inspect", pb.InspectRequest(runtime_id="rt", handle_id="root/b.1"))
        assert inspected.handle.handle_id == "root/b.1"
        with pytest.raises(ValueError, match="no unary RPC"):
            await client.call("Watch", pb.WatchRequest(runtime_id="rt"))
    [first, second] = servicer.of("Post")
    assert first.request_id == second.request_id and _is_uuid4(first.request_id)
    assert post.request_id == ""  # a copy was sent
    assert [attempt.request_id for attempt in servicer.of("Close")] == ["close-1"]


async def test_the_sync_client_passes_request_ids_and_retries(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.refuse(1)

    def blocking() -> tuple[str, list[str]]:  # in a thread: the stand-in runs on this test's loop
        with SyncClient(address) as client:
            handle = client.spawn("rt", "a", request_id="sync-1")
            closed = client.close("rt", handle, request_id="sync-2")
            return handle, closed

    assert await asyncio.to_thread(blocking) == ("root/a.1", ["root/a.1"])
    sent = [(attempt.method, attempt.request_id) for attempt in servicer.attempts]
    assert sent == [("Spawn", "sync-1"), ("Spawn", "sync-1"), ("Close", "sync-2")]


# ---- (b) what is retried, and how long it waits ------------------------------------------------


@pytest.mark.parametrize("method", list(READS))
async def test_every_read_is_retried_on_unavailable(flaky: tuple[Flaky, str], method: str) -> None:
    servicer, address = flaky
    servicer.refuse(2)
    async with Client(address) as client:
        await READS[method](client)
    assert len(servicer.of(method)) == 3


async def test_any_status_with_retry_info_is_retried_after_its_retry_delay_at_least(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    busy = refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many at once", reason="SOME_LIMIT", retry_delay=0.3)
    servicer.refuse(2, busy)
    async with Client(address) as client:
        assert await client.wake("rt", "root/a.1") is False
    times = [attempt.at for attempt in servicer.of("Wake")]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.3 and times[2] - times[1] >= 0.3  # never sooner than the server asked


async def test_an_unavailable_with_retry_info_waits_its_retry_delay(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.refuse(1, refusal(grpc.StatusCode.UNAVAILABLE, "runtime 'rt' is moving", reason="RUNTIME_MOVING", retry_delay=0.4))
    async with Client(address) as client:
        assert (await client.inspect("rt", "root/a.1")).handle_id == "root/a.1"
    first, second = servicer.of("Inspect")
    assert second.at - first.at >= 0.4


async def test_an_attempt_past_its_own_deadline_is_retried(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.holds = 1  # the first attempt gets no answer within the client's 0.5 s
    async with Client(address, timeout=0.5) as client:
        assert await client.spawn("rt", "a") == "root/a.1"
    first, second = servicer.of("Spawn")
    assert first.request_id == second.request_id
    assert second.at - first.at >= 0.5


async def test_the_retry_info_and_reason_are_on_the_error(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.refuse(1, refusal(grpc.StatusCode.UNAVAILABLE, "the store is broken", reason="STORE_BROKEN", retry_delay=1.5))
    async with Client(address, retries=False) as client:
        with pytest.raises(AgentRuntimeError) as refused:
            await client.inspect("rt", "root/a.1")
    error = refused.value
    assert error.is_unavailable and error.reason == "STORE_BROKEN"
    assert error.retry_info is not None and error.retry_info.retry_delay.ToMilliseconds() == 1500


# ---- (c) what is not retried ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "status",
    [
        refusal(grpc.StatusCode.FAILED_PRECONDITION, "handle 'root/a.1' is running", reason="HANDLE_RUNNING"),
        refusal(grpc.StatusCode.INVALID_ARGUMENT, "request id 'x' was used for another request", reason="REQUEST_ID_REUSED"),
        refusal(grpc.StatusCode.NOT_FOUND, "runtime 'rt' not found"),
        refusal(grpc.StatusCode.DEADLINE_EXCEEDED, "the server's own deadline"),  # not this attempt's: sent long before it
    ],
    ids=["FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "DEADLINE_EXCEEDED"],
)
async def test_another_code_is_not_retried(flaky: tuple[Flaky, str], status: grpc.Status) -> None:
    servicer, address = flaky
    async with Client(address) as client:
        servicer.refuse(1, status)
        with pytest.raises(AgentRuntimeError) as refused:
            await client.wake("rt", "root/a.1", "go")
        assert refused.value.code == status.code
        servicer.refuse(1, status)
        with pytest.raises(AgentRuntimeError) as refused:
            await client.wait("rt", "root/a.1")
        assert refused.value.code == status.code
    assert [attempt.method for attempt in servicer.attempts] == ["Wake", "Wait"]


async def test_nothing_is_retried_after_the_caller_cancels(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    async with Client(address) as client:
        servicer.holds = 1  # cancelled during an attempt
        waking = asyncio.ensure_future(client.wake("rt", "root/a.1"))
        await until(lambda: len(servicer.attempts) == 1, "the first attempt at the server")
        waking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waking

        # cancelled while it waits to try again (the server asked for half a second)
        servicer.refuse(None, refusal(grpc.StatusCode.UNAVAILABLE, "moving", reason="RUNTIME_MOVING", retry_delay=0.5))
        posting = asyncio.ensure_future(client.post("rt", "root/a.1", "hi"))
        await until(lambda: len(servicer.attempts) == 2, "the Post's first attempt at the server")
        await asyncio.sleep(0.2)  # its refusal back at the client, which waits
        posting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await posting
        await asyncio.sleep(0.6)  # a retry would have come by now
    assert [attempt.method for attempt in servicer.attempts] == ["Wake", "Post"]


# ---- (d) retries off ---------------------------------------------------------------------------


async def test_retries_off_makes_one_attempt_and_still_sends_a_request_id(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    async with Client(address, retries=False) as client:
        assert client.retries is False
        for call in (
            lambda: client.spawn("rt", "a"),
            lambda: client.post("rt", "root/a.1", "hi", request_id="given"),
            lambda: client.inspect("rt", "root/a.1"),
            lambda: client.wait("rt", "root/a.1"),
        ):
            servicer.refuse(1)
            with pytest.raises(AgentRuntimeError) as refused:
                await call()
            assert refused.value.is_unavailable
        servicer.refuse(1)
        with pytest.raises(AgentRuntimeError):
            await anext(aiter(client.watch("rt", backoff=0.01)))
    assert [attempt.method for attempt in servicer.attempts] == ["Spawn", "Post", "Inspect", "Wait", "Watch"]
    assert _is_uuid4(servicer.attempts[0].request_id) and servicer.attempts[1].request_id == "given"


# ---- (e) the window bounds it --------------------------------------------------------------------


async def test_the_retry_window_bounds_a_run_of_failures(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.refuse(None)
    async with Client(address, retry_window=1.0) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(AgentRuntimeError) as refused:
            await asyncio.wait_for(client.spawn("rt", "a"), 30)
        took = loop.time() - started
    assert refused.value.is_unavailable
    times = [attempt.at for attempt in servicer.attempts]
    assert len(times) >= 3  # retried ...
    # ... but no attempt started after the window. It runs from the first *failure* the client
    # read, and these are the times attempts reached the server: the spread may pass the window
    # by a round trip (a full suite's run saw 1.002 s), never by the next backoff and more.
    assert times[-1] - times[0] < 1.0 + 0.5 and took < 10
    assert len({attempt.request_id for attempt in servicer.attempts}) == 1


async def test_a_zero_window_retries_nothing_and_a_negative_one_is_refused(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.refuse(1)
    async with Client(address, retry_window=0) as client:
        with pytest.raises(AgentRuntimeError):
            await asyncio.wait_for(client.list_runtimes(), 30)
    assert len(servicer.attempts) == 1
    with pytest.raises(ValueError, match="retry_window"):
        Client(address, retry_window=-1)


async def test_a_wait_on_a_broken_store_fails_after_the_window_instead_of_hanging(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.refuse(None, refusal(grpc.StatusCode.UNAVAILABLE, "the store is broken", reason="STORE_BROKEN", retry_delay=0.2))
    async with Client(address, retry_window=1.5) as client:
        with pytest.raises(AgentRuntimeError) as refused:
            await asyncio.wait_for(client.wait("rt", "root/a.1"), 30)
    assert refused.value.reason == "STORE_BROKEN"
    times = [attempt.at for attempt in servicer.of("Wait")]
    assert len(times) >= 3 and times[-1] - times[0] < 1.5
    assert all(later - earlier >= 0.2 for earlier, later in itertools.pairwise(times))  # its retry_delay


async def test_a_wait_that_gets_answers_between_failures_starts_a_new_window_after_each(flaky: tuple[Flaky, str]) -> None:
    """A success resets the run: runs of failures with answers between them (a slice of the
    Wait that ends TIMEOUT) add up to more than the window, and the Wait goes on."""
    servicer, address = flaky
    moving = refusal(grpc.StatusCode.UNAVAILABLE, "runtime 'rt' is moving", reason="RUNTIME_MOVING", retry_delay=0.3)
    slice_over = pb.WaitResponse(result=pb.TaskResult(handle_id="root/a.1", status=pb.STATUS_TIMEOUT))
    servicer.plan = [moving, moving, slice_over, moving, moving, slice_over, moving, moving]
    async with Client(address, retry_window=1.5) as client:
        assert await asyncio.wait_for(client.wait("rt", "root/a.1"), 30) == DONE
    times = [attempt.at for attempt in servicer.of("Wait")]
    assert len(times) == 9 and times[-1] - times[0] >= 1.8  # six waits of 0.3 s at least: longer than the window


async def test_a_watch_failing_in_a_row_gives_up_after_the_window_and_an_event_resets_it(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    moving = refusal(grpc.StatusCode.UNAVAILABLE, "runtime 'rt' is moving", reason="RUNTIME_MOVING", retry_delay=0.3)
    async with Client(address, retry_window=0.5) as client:
        seqs = []
        servicer.refuse(0, moving)  # each stream gives one event and is cut, asking for 0.3 s
        async for event in client.watch("rt", max_retries=1000, backoff=0.01):
            seqs.append(event.seq)
            if len(seqs) == 5:
                break
        assert seqs == [1, 2, 3, 4, 5]
        times = [attempt.at for attempt in servicer.attempts]
        assert times[-1] - times[0] >= 1.2  # four reconnects after 0.3 s each: past the window, which each event restarted

        servicer.attempts.clear()
        servicer.refuse(None)  # every stream refused at once
        with pytest.raises(AgentRuntimeError) as refused:
            await asyncio.wait_for(anext(aiter(client.watch("rt", max_retries=1000, backoff=0.01))), 30)
    assert refused.value.is_unavailable
    times = [attempt.at for attempt in servicer.attempts]
    assert len(times) >= 3 and times[-1] - times[0] < 0.5


class Batches(pb_grpc.AgentRuntimeServicer):
    """A Watch that sends the three events after `after_seq` in one batch (when asked for
    batches), then cuts the stream; each request is kept."""

    def __init__(self) -> None:
        self.requests: list[pb.WatchRequest] = []

    async def Watch(
        self,
        request: pb.WatchRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[pb.WatchResponse]:
        self.requests.append(request)
        events = [pb.Event(seq=request.after_seq + n, handle_id="root/a.1") for n in (1, 2, 3)]
        if request.batch:
            yield pb.WatchResponse(events=events)
        await context.abort_with_status(UNAVAILABLE)


async def test_a_watch_asks_for_batches_hands_their_events_over_one_by_one_and_goes_on_after_the_last() -> None:
    servicer = Batches()  # type: ignore[abstract]
    server = grpc.aio.server()
    pb_grpc.add_AgentRuntimeServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        async with Client(address) as client:
            seqs = []
            async for event in client.watch("rt", max_retries=10, backoff=0.01):
                seqs.append(event.seq)
                if len(seqs) == 7:
                    break
    finally:
        await server.stop(None)
    assert seqs == [1, 2, 3, 4, 5, 6, 7]
    assert [(r.after_seq, r.batch) for r in servicer.requests] == [(0, True), (3, True), (6, True)]


# ---- (f) forks and replays -----------------------------------------------------------------------


async def test_a_fork_is_retried_on_unavailable_with_one_request_id_and_sends_its_changes(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    seen: list[pb.ForkRuntimeRequest] = []
    servicer.plan = [UNAVAILABLE, UNAVAILABLE]
    answer = pb.Answer(id="req-1", ok=False, reason="change freeze")
    agents = [pb.AgentDef(name="a", description="the a agent")]
    original = ANSWERS["ForkRuntime"]

    def recording(request: pb.ForkRuntimeRequest) -> Any:
        seen.append(request)
        return original(request)

    ANSWERS["ForkRuntime"] = recording
    try:
        async with Client(address) as client:
            forked = await client.fork_runtime(
                "rt",
                6,
                runtime_id="rt-f",
                agents=agents,
                messages=[pb.ForkMessage(handle_id="root/a.1", text="again")],
                answers=[answer],
            )
    finally:
        ANSWERS["ForkRuntime"] = original
    assert (forked.runtime_id, forked.fork_seq, list(forked.held_handle_ids)) == ("rt-f", 6, ["root/a.1"])
    ids = [attempt.request_id for attempt in servicer.of("ForkRuntime")]
    assert len(ids) == 3 and len(set(ids)) == 1 and _is_uuid4(ids[0])  # two refusals, then the answer: one id
    [request] = seen
    assert (request.source_runtime_id, request.at_seq, request.runtime_id) == ("rt", 6, "rt-f")
    assert list(request.agents) == agents and list(request.answers) == [answer]
    assert [(m.handle_id, m.text) for m in request.messages] == [("root/a.1", "again")]


class Replays(pb_grpc.AgentRuntimeServicer):
    """A ReplayRuntime that answers `settled: false` the first `unsettled` times (after holding
    each attempt `hold` seconds, as a server waiting its `timeout` out would), then settled; each
    request is kept with the time it came."""

    def __init__(self, unsettled: int, hold: float = 0.0) -> None:
        self.unsettled = unsettled
        self.hold = hold
        self.requests: list[tuple[pb.ReplayRuntimeRequest, float]] = []

    async def ReplayRuntime(
        self,
        request: pb.ReplayRuntimeRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> pb.ReplayRuntimeResponse:
        self.requests.append((request, asyncio.get_running_loop().time()))
        await asyncio.sleep(self.hold)
        diff = pb.ReplayDiff(handle_id="root/a.1", recorded=DONE, changed=["text"])
        if len(self.requests) <= self.unsettled:
            return pb.ReplayRuntimeResponse(runtime_id="rt-replay", diffs=[diff], settled=False)
        diff.replayed.CopyFrom(DONE)
        return pb.ReplayRuntimeResponse(runtime_id="rt-replay", diffs=[diff], settled=True, changed_count=1)


@asynccontextmanager
async def serving(servicer: pb_grpc.AgentRuntimeServicer) -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_AgentRuntimeServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        yield address
    finally:
        await server.stop(None)


async def test_a_replay_sends_the_same_request_again_while_it_is_not_settled() -> None:
    servicer = Replays(unsettled=3)  # type: ignore[abstract]
    agents = [pb.AgentDef(name="a", description="the a agent")]
    async with serving(servicer) as address, Client(address, timeout=1.0) as client:
        replayed = await client.replay_runtime(
            "rt", agents=agents, unrecorded_calls=pb.UNRECORDED_CALLS_LIVE, runtime_id="rt-replay"
        )
    assert replayed.settled and replayed.changed_count == 1 and replayed.diffs[0].replayed == DONE
    requests = [request for request, _ in servicer.requests]
    assert len(requests) == 4
    assert all(request == requests[0] for request in requests)  # the same request, request id and timeout included
    first = requests[0]
    assert _is_uuid4(first.request_id)
    assert (first.source_runtime_id, first.runtime_id, first.unrecorded_calls) == ("rt", "rt-replay", pb.UNRECORDED_CALLS_LIVE)
    assert list(first.agents) == agents
    # Each attempt asks the server to wait one slice, under the attempt's own deadline (the
    # client's default of 1 s is far shorter: the attempt's deadline is the slice and a margin).
    assert first.timeout.ToSeconds() == 30


async def test_a_replay_gives_the_callers_request_id_and_stops_at_its_timeout() -> None:
    servicer = Replays(unsettled=1000, hold=0.3)  # type: ignore[abstract]
    async with serving(servicer) as address, Client(address) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        replayed = await client.replay_runtime("rt", request_id="mine", timeout=1.0)
        took = loop.time() - started
    assert not replayed.settled  # the last answer, as it was
    requests = [request for request, _ in servicer.requests]
    assert {request.request_id for request in requests} == {"mine"}
    assert 1.0 <= took < 2.5 and 3 <= len(requests) <= 5
    assert all(request.timeout.ToMilliseconds() == 1000 for request in requests)  # one slice: the timeout


async def test_a_replay_attempt_refused_unavailable_is_retried_with_its_request_id(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.plan = [UNAVAILABLE, pb.ReplayRuntimeResponse(runtime_id="rt-replay", settled=False), UNAVAILABLE]
    async with Client(address) as client:
        replayed = await client.replay_runtime("rt")
    assert replayed.settled
    ids = [attempt.request_id for attempt in servicer.of("ReplayRuntime")]
    assert len(ids) == 4 and len(set(ids)) == 1 and _is_uuid4(ids[0])


async def test_list_runtimes_sends_forks_of() -> None:
    class Listing(pb_grpc.AgentRuntimeServicer):
        def __init__(self) -> None:
            self.requests: list[pb.ListRuntimesRequest] = []

        async def ListRuntimes(
            self,
            request: pb.ListRuntimesRequest,
            context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
        ) -> pb.ListRuntimesResponse:
            self.requests.append(request)
            fork = pb.RuntimeSummary(runtime_id="rt-f", forked_from=request.forks_of, fork_seq=7)
            return pb.ListRuntimesResponse(runtimes=[fork], next_page_token="" if request.page_token else "more")

    servicer = Listing()  # type: ignore[abstract]
    async with serving(servicer) as address:
        async with Client(address) as client:
            forks = await client.list_runtimes(forks_of="rt")

        def blocking() -> list[pb.RuntimeSummary]:
            with SyncClient(address) as sync:
                return sync.list_runtimes(forks_of="rt")

        synced = await asyncio.to_thread(blocking)
    assert (
        [(f.runtime_id, f.forked_from, f.fork_seq) for f in forks]
        == [("rt-f", "rt", 7)] * 2
        == [(f.runtime_id, f.forked_from, f.fork_seq) for f in synced]
    )
    assert [(r.forks_of, r.page_token) for r in servicer.requests] == [("rt", ""), ("rt", "more")] * 2


async def test_the_sync_client_forks_and_replays(flaky: tuple[Flaky, str]) -> None:
    servicer, address = flaky
    servicer.refuse(1)

    def blocking() -> tuple[pb.ForkRuntimeResponse, pb.ReplayRuntimeResponse]:
        with SyncClient(address) as client:
            return client.fork_runtime("rt", 4, request_id="sync-f"), client.replay_runtime("rt", request_id="sync-r")

    forked, replayed = await asyncio.to_thread(blocking)
    assert (forked.runtime_id, forked.fork_seq, replayed.settled) == ("rt-fork", 4, True)
    sent = [(attempt.method, attempt.request_id) for attempt in servicer.attempts]
    assert sent == [("ForkRuntime", "sync-f"), ("ForkRuntime", "sync-f"), ("ReplayRuntime", "sync-r")]
