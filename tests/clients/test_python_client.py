"""The Python client over a real server: waiting past its deadline, a server restart in the
middle of `run()` that the caller never sees, a worker that keeps reconnecting however long
the server is away, and a Watch allowed many retries that waits a bounded time between them."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Any

import grpc
import pytest
from agentruntime.client import AgentRuntimeError, Client
from agentruntime.sync import SyncClient
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.process import ServerProcess, free_port
from tests.support.servers import Served, serve


async def test_wait_outlasts_the_clients_call_deadline_and_timeout_is_the_callers(
    served: Served, model: ScriptedModelServer
) -> None:
    model.script("slow", lambda body: Reply(text="finally", tokens=7, delay=3.0))
    async with Client(f"127.0.0.1:{served.running.port}", timeout=1.0) as client:  # every call's deadline: 1 s
        runtime_id = await client.create_runtime([agent("slow")])
        handle_id = await client.spawn(runtime_id, "slow")
        await client.wake(runtime_id, handle_id, "go")
        early = await client.wait(runtime_id, handle_id, timeout=0.3)
        assert early.status == pb.STATUS_TIMEOUT  # the caller's choice
        result = await client.wait(runtime_id, handle_id)  # longer than the 1 s deadline: no DEADLINE_EXCEEDED
        assert (result.status, result.text, result.own_tokens) == (pb.STATUS_DONE, "finally", 7)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
async def test_a_server_restart_in_the_middle_of_run_is_invisible_to_the_caller(
    process: ServerProcess, model: ScriptedModelServer, how: signal.Signals
) -> None:
    model.script("slow", lambda body: Reply(text="done anyway", tokens=9, delay=1.0))
    await process.start()
    async with Client(process.address) as client:
        runtime_id = await client.create_runtime([agent("slow")])
        running = asyncio.ensure_future(client.run(runtime_id, "slow", "go"))
        await until(lambda: model.in_flight > 0, "the model call to be out (the run mid-turn)")
        await process.stop(how)
        await asyncio.sleep(0.5)  # down for a while
        await process.restart()
        result = await asyncio.wait_for(running, 60)
    assert (result.status, result.text, result.turns, result.own_tokens) == (pb.STATUS_DONE, "done anyway", 1, 9)


async def test_errors_have_typed_details_and_predicates(served: Served, model: ScriptedModelServer) -> None:
    model.script("slow", lambda body: Reply(text="done", delay=2.0))
    async with Client(f"127.0.0.1:{served.running.port}") as client:
        runtime_id = await client.create_runtime([agent("slow")])
        with pytest.raises(AgentRuntimeError) as missing:
            await client.inspect(runtime_id, "root/nobody.1")
        assert missing.value.is_not_found and not missing.value.is_unavailable
        assert missing.value.resource_info is not None and missing.value.resource_info.resource_name == "root/nobody.1"
        with pytest.raises(AgentRuntimeError) as invalid:
            await client.create_runtime([pb.AgentDef(name="9 bad", description="d")])
        assert invalid.value.is_invalid_argument and invalid.value.bad_request is not None
        assert [v.field for v in invalid.value.bad_request.field_violations] == ["agents[0].name"]
        handle_id = await client.spawn(runtime_id, "slow")
        await client.wake(runtime_id, handle_id, "go")
        with pytest.raises(AgentRuntimeError) as running:
            await client.wake(runtime_id, handle_id, "again")
        assert running.value.is_failed_precondition and running.value.reason == "HANDLE_RUNNING"


async def test_the_sync_client_runs_watches_serves_and_refuses_like_the_async_one(
    served: Served, model: ScriptedModelServer
) -> None:
    model.script(
        "planner",
        lambda body: Reply(text="42", tokens=5) if tool_results(body) else Reply(calls=[("double", {"n": 21})], tokens=5),
    )
    address = f"127.0.0.1:{served.running.port}"

    def script() -> tuple[pb.TaskResult, list[int], str]:
        with SyncClient(address, timeout=5.0) as client:
            tool = pb.ToolDef(name="double", description="doubles", worker=pb.WorkerTool(queue="sync"))
            runtime_id = client.create_runtime([agent("planner", tools=[tool])])
            serving = threading.Thread(
                target=lambda: client.serve_tools("sync", {"double": lambda arguments, call: str(arguments["n"] * 2)}),
                daemon=True,
            )
            serving.start()
            result = client.run(runtime_id, "planner", "double 21")
            seqs = []
            for event in client.watch(runtime_id):
                seqs.append(event.seq)
                if len(seqs) == 3:
                    break
            try:
                client.inspect(runtime_id, "root/nobody.1")
            except AgentRuntimeError as error:
                refused = error.resource_info.resource_name if error.is_not_found and error.resource_info else ""
            return result, seqs, refused

    result, seqs, refused = await asyncio.to_thread(script)
    assert (result.status, result.text, result.tool_calls, result.turns) == (pb.STATUS_DONE, "42", 1, 2)
    assert seqs == [1, 2, 3] and refused == "root/nobody.1"


class _Recorder(grpc.aio.UnaryUnaryClientInterceptor):
    """A caller's interceptor: sees every unary call's method and metadata."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        self.calls.append(method.rsplit("/", 1)[-1])
        return await continuation(details, request)


async def test_interceptors_keepalive_and_page_iterators(served: Served, model: ScriptedModelServer) -> None:
    model.script("quick", lambda body: Reply(text="ok", tokens=2))
    recorder = _Recorder()
    with pytest.raises(ValueError, match="keepalive"):
        Client("127.0.0.1:1", keepalive=0)
    async with Client(
        f"127.0.0.1:{served.running.port}", keepalive=1.0, keepalive_without_calls=True, interceptors=[recorder]
    ) as client:
        runtime_id = await client.create_runtime([agent("quick")])
        handles = [await client.spawn(runtime_id, "quick") for _ in range(5)]
        result = await client.run(runtime_id, "quick", "hi")
        await asyncio.sleep(2.5)  # idle past two keepalive pings: the server permits them (no GOAWAY)
        listed = [view.handle_id async for view in client.iter_handles(runtime_id, page_size=2)]
        messages = [message.role async for message in client.iter_transcript(runtime_id, result.handle_id, page_size=1)]
        runtimes = [summary.runtime_id async for summary in client.iter_runtimes(page_size=1)]
        assert (await client.inspect(runtime_id, result.handle_id)).turns == 1  # the channel still works
    assert listed == [*handles, result.handle_id]
    assert messages == ["user", "assistant"]
    assert runtime_id in runtimes
    assert recorder.calls.count("List") == 3 and recorder.calls.count("GetTranscript") == 2
    assert recorder.calls[:2] == ["CreateRuntime", "Spawn"]

    def blocking() -> tuple[list[str], list[str]]:  # in a thread: the server runs on this test's loop
        with SyncClient(f"127.0.0.1:{served.running.port}") as sync:
            handles = [view.handle_id for view in sync.iter_handles(runtime_id, page_size=4)]
            return handles, [summary.runtime_id for summary in sync.iter_runtimes(page_size=1)]

    sync_listed, sync_runtimes = await asyncio.to_thread(blocking)
    assert sync_listed == listed and runtime_id in sync_runtimes


async def test_keepalive_is_on_by_default_while_calls_are_open(served: Served) -> None:
    """Without pings a Watch or a worker's stream behind a NAT or a proxy that dropped the
    connection waits forever: by default the channel pings after 60 s without activity, only
    while a call is open, and drops the connection after 20 s without an answer."""
    target = f"127.0.0.1:{served.running.port}"
    keepalive = {
        "grpc.keepalive_time_ms": 60_000,
        "grpc.keepalive_timeout_ms": 20_000,
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.http2.max_pings_without_data": 0,  # gRPC's default (2) would stop them on a quiet Watch
    }
    async with Client(target) as client:
        assert {name: value for name, value in client.channel_options if name in keepalive} == keepalive
        assert isinstance(await client.list_runtimes(), list)  # the server takes the channel as it is
    async with Client(target, keepalive=None) as quiet:
        assert not [name for name, _ in quiet.channel_options if "ping" in name or "keepalive" in name]
        assert isinstance(await quiet.list_runtimes(), list)

    def blocking() -> tuple[tuple[str, Any], ...]:  # in a thread: the server runs on this test's loop
        with SyncClient(target) as sync:
            sync.list_runtimes()
            return sync.channel_options

    sync_options = await asyncio.to_thread(blocking)
    assert {name: value for name, value in sync_options if name in keepalive} == keepalive


# ---- a long outage, and a Watch allowed many retries ------------------------------------------------


async def test_a_worker_keeps_reconnecting_through_a_long_outage() -> None:
    port = free_port()
    drops = 0

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal drops
            drops += 1

    counter = Counter()
    worker_log = logging.getLogger("agentruntime.worker")
    worker_log.addHandler(counter)
    registered = asyncio.Event()
    try:
        async with Client(f"127.0.0.1:{port}") as client:
            # No wait between attempts: the failures of a long outage, in a moment.
            serving = asyncio.ensure_future(
                client.serve_tools(
                    "q", {"t": lambda arguments, call: "x"}, max_backoff=0.0, registered=lambda _: registered.set()
                )
            )
            await until(lambda: drops > 1100 or serving.done(), "over 1,100 failed connections", timeout=30)
            # The 1024th failure used to raise OverflowError (2**1024 as a float) and end the worker.
            assert not serving.done(), serving.exception()
            assert drops > 1100
            async with serve(listen=f"127.0.0.1:{port}"):
                await asyncio.wait_for(registered.wait(), 30)
            serving.cancel()
    finally:
        worker_log.removeHandler(counter)


async def test_a_watch_allowed_many_retries_waits_a_bounded_time_between_them() -> None:
    """max_retries is the caller's; the wait between reconnects doubles only up to a cap, so
    a large max_retries neither waits for ages nor overflows (2**1024 is no float)."""
    port = free_port()
    async with Client(f"127.0.0.1:{port}") as client:
        watching = client.watch("rt", max_retries=1100, backoff=1e-300).__anext__()
        try:
            await asyncio.wait_for(watching, 60)
        except Exception as error:  # every reconnect refused: after the last, the UNAVAILABLE
            assert type(error).__name__ == "AgentRuntimeError", error
            assert "UNAVAILABLE" in str(error) or "failed to connect" in str(error), error
