"""Worker tools: hosts serve tools inline over ServeTools. A worker that misses a call's deadline
keeps it in hand (its max_concurrent_calls holds) and never gets it again. A call in doubt
whose retry no worker takes within its timeout still says that a worker took it and it may or
may not have taken effect: "no worker took the call" would tell the model the call never ran,
and invite it to make the call again under a new key (a second charge). A worker leaving with
a call it kept past its deadline logs nothing as an exception never retrieved. A real server,
the Python client's `serve_tools` as the host (in this process, or in a process of its own
that a test kills), a scripted model over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.client import Client, ToolHandler
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.api import jwt_auth
from agentruntime_server.api.servicer import STREAM_RECHECK_SECONDS
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import json_format

from tests.support.auth import AUDIENCE, ISSUER, JwksServer, bearer, public_jwk, sign
from tests.support.build import agent, create, duration, run, spawn, status_details, transcript, wait
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.process import ServerProcess
from tests.support.servers import Served, serve


def worker_tool(name: str, queue: str = "tools", timeout: float | None = None, **fields: Any) -> pb.ToolDef:
    tool = pb.ToolDef(name=name, description=f"the {name} tool", worker=pb.WorkerTool(queue=queue), **fields)
    if timeout is not None:
        tool.worker.timeout.CopyFrom(duration(timeout))
    return tool


def calls_then_answer(*calls: tuple[str, dict[str, Any]]) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=list(calls), tokens=30)
        outputs = [message["content"] for message in body["messages"] if message["role"] == "tool"]
        return Reply(text=" | ".join(outputs), tokens=20)

    return script


@contextlib.asynccontextmanager
async def serving(client: Client, queue: str, handlers: Mapping[str, ToolHandler], limit: int = 10) -> AsyncIterator[list[str]]:
    """A worker of this process serving `queue` while the block runs; yields its ids."""
    ids: list[str] = []
    task = asyncio.ensure_future(client.serve_tools(queue, handlers, max_concurrent_calls=limit, registered=ids.append))
    try:
        await until(lambda: bool(ids), "the worker to register")
        yield ids
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def client(served: Served) -> AsyncIterator[Client]:
    async with Client(f"127.0.0.1:{served.running.port}") as made:
        yield made


async def test_an_agent_calls_two_worker_tools_in_one_turn_and_the_figures_are_exact(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("planner", calls_then_answer(("weather", {"city": "Oslo"}), ("clock", {"zone": "CET"})))
    seen: list[pb.WorkerCall] = []

    async def weather(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        seen.append(call)
        await asyncio.sleep(0.05)
        return f"rain in {arguments['city']}"

    def clock(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        seen.append(call)
        return f"12:00 {arguments['zone']}"

    runtime_id = await create(stub, agent("planner", tools=[worker_tool("weather"), worker_tool("clock")]))
    async with serving(client, "tools", {"weather": weather, "clock": clock}):
        handle_id, result = await run(stub, runtime_id, "planner", "plan the day")
    assert (result.status, result.text) == (pb.STATUS_DONE, "rain in Oslo | 12:00 CET")
    assert (result.turns, result.own_tokens, result.total_tokens, result.tool_calls) == (2, 50, 50, 2)
    assert sorted(call.call.idempotency_key for call in seen) == [
        f"{runtime_id}/{handle_id}/call_1_1",
        f"{runtime_id}/{handle_id}/call_1_2",
    ]
    assert {(call.runtime_id, call.handle_id) for call in seen} == {(runtime_id, handle_id)}
    assert all(call.deadline.seconds > 0 for call in seen)
    tool_messages = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert [(m.content, m.is_error) for m in tool_messages] == [("rain in Oslo", False), ("12:00 CET", False)]


async def test_a_handler_that_raises_answers_an_error_result(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("planner", calls_then_answer(("weather", {})))

    def broken(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        raise KeyError("city")

    runtime_id = await create(stub, agent("planner", tools=[worker_tool("weather")]))
    async with serving(client, "tools", {"weather": broken}):
        handle_id, result = await run(stub, runtime_id, "planner", "go")
    assert result.status == pb.STATUS_DONE
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert (tool_message.content, tool_message.is_error) == ("KeyError: 'city'", True)


async def test_with_no_worker_connected_the_call_fails_after_its_timeout(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("planner", calls_then_answer(("weather", {})))
    runtime_id = await create(stub, agent("planner", tools=[worker_tool("weather", queue="nobody", timeout=0.3)]))
    handle_id, result = await run(stub, runtime_id, "planner", "go")
    assert (result.status, result.tool_calls) == (pb.STATUS_DONE, 1)
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error and "no worker of queue 'nobody' took the call within 0.3s" in tool_message.content


async def test_a_call_waits_for_a_worker_that_connects_within_its_timeout(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("planner", calls_then_answer(("weather", {})))
    runtime_id = await create(stub, agent("planner", tools=[worker_tool("weather", timeout=10)]))
    handle_id = await spawn(stub, runtime_id, "planner")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
    await asyncio.sleep(0.3)  # the call is waiting: nobody serves the queue yet
    async with serving(client, "tools", {"weather": lambda arguments, call: "late sun"}):
        result = await wait(stub, runtime_id, handle_id)
    assert (result.status, result.text) == (pb.STATUS_DONE, "late sun")


async def test_200_calls_spread_over_3_workers_never_past_their_limit(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("fan", calls_then_answer(*[("work", {"n": n}) for n in range(10)]))
    runtime_id = await create(stub, agent("fan", tools=[worker_tool("work")]))
    holding: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    served: Counter[str] = Counter()

    def worker(name: str) -> Any:
        async def work(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
            holding[name] += 1
            peak[name] = max(peak[name], holding[name])
            served[name] += 1
            await asyncio.sleep(0.02)
            holding[name] -= 1
            return f"done {arguments['n']}"

        return work

    async with (
        serving(client, "tools", {"work": worker("a")}, limit=5),
        serving(client, "tools", {"work": worker("b")}, limit=5),
        serving(client, "tools", {"work": worker("c")}, limit=5),
    ):
        results = await asyncio.gather(*(run(stub, runtime_id, "fan", f"batch {n}") for n in range(20)))
    assert all(result.status == pb.STATUS_DONE and result.tool_calls == 10 for _, result in results)
    assert sum(served.values()) == 200
    assert max(peak.values()) <= 5 and min(served.values()) >= 50, (peak, served)


async def test_a_worker_that_goes_away_with_a_call_leaves_it_to_another_with_the_same_key(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    runtime_id = await create(stub, agent("payer", tools=[worker_tool("charge")]))
    first_keys: list[str] = []
    second_keys: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        first_keys.append(call.call.idempotency_key)
        await asyncio.sleep(3600)
        return "never"

    async with serving(client, "tools", {"charge": hangs}):
        handle_id = await spawn(stub, runtime_id, "payer")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
        await until(lambda: bool(first_keys), "the first worker to hold the call")
    # The first worker is gone with the call (RETRY, the default): the next worker runs it.

    def charge(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        second_keys.append(call.call.idempotency_key)
        return "charged once"

    async with serving(client, "tools", {"charge": charge}):
        result = await wait(stub, runtime_id, handle_id)
    assert (result.status, result.text) == (pb.STATUS_DONE, "charged once")
    assert first_keys == second_keys == [f"{runtime_id}/{handle_id}/call_1_1"]


def one_call_then_echo(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("slow", {})])
    return Reply(text=next(m["content"] for m in body["messages"] if m["role"] == "tool"))


async def test_a_worker_that_misses_the_deadline_keeps_the_call_in_hand_and_never_gets_it_again(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("a", one_call_then_echo)
    running = {"now": 0, "peak": 0, "calls": 0}

    async def slow(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        running["calls"] += 1
        running["now"] += 1
        running["peak"] = max(running["peak"], running["now"])
        try:
            await asyncio.sleep(1.5)
            return "slow ok"
        finally:
            running["now"] -= 1

    runtime_id = await create(stub, agent("a", tools=[worker_tool("slow", timeout=0.3)]))
    async with serving(client, "tools", {"slow": slow}, limit=1) as ids:
        handle_id, result = await run(stub, runtime_id, "a", "go")
    # One worker, bound 1: the call it kept past its deadline is not sent to it again.
    assert (running["calls"], running["peak"]) == (1, 1)
    assert result.status == pb.STATUS_DONE
    assert f"worker {ids[0]} of queue 'tools' took the call and did not answer by its deadline" in result.text
    assert "may or may not have taken effect" in result.text
    [tool_message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error


async def test_a_call_a_worker_kept_past_its_deadline_goes_to_another_worker_and_counts_against_the_first(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("a", one_call_then_echo)
    invoked: list[str] = []
    release = asyncio.Event()

    def worker(name: str) -> Any:
        async def work(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
            invoked.append(name)
            if len(invoked) == 1:
                await release.wait()  # the first taker misses the deadline, and holds on
            return f"done by {name}"

        return work

    runtime_id = await create(stub, agent("a", tools=[worker_tool("slow", timeout=0.3)]))
    async with (
        serving(client, "tools", {"slow": worker("one")}, limit=1),
        serving(client, "tools", {"slow": worker("two")}, limit=1),
    ):
        _, result = await run(stub, runtime_id, "a", "go")
        first, second = invoked
        assert first != second and result.text == f"done by {second}"
        # The late taker still holds the first call: a second run's call goes to the other one.
        _, again = await run(stub, runtime_id, "a", "go again")
        assert again.text == f"done by {second}" and invoked == [first, second, second]
        release.set()


async def test_with_ask_a_lost_call_suspends_in_doubt_and_the_host_decides(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client
) -> None:
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    charge = worker_tool("charge", on_interrupted=pb.ON_INTERRUPTED_ASK)
    runtime_id = await create(stub, agent("payer", tools=[charge]))
    held: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        held.append(call.id)
        await asyncio.sleep(3600)
        return "never"

    async with serving(client, "tools", {"charge": hangs}):
        handle_id = await spawn(stub, runtime_id, "payer")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
        await until(lambda: bool(held), "the worker to hold the call")
    pending = await wait(stub, runtime_id, handle_id)
    assert (pending.status, pending.pending.kind) == (pb.STATUS_PENDING, "in_doubt")
    [call] = pending.pending.calls
    assert (call.name, call.idempotency_key) == ("charge", f"{runtime_id}/{handle_id}/call_1_1")
    answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="it went through")])
    done = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer), timeout=30)).result
    assert (done.status, done.text) == (pb.STATUS_DONE, "it went through")


async def test_a_bad_registration_is_refused_with_its_violations(served: Served) -> None:
    async def register(registration: pb.WorkerRegistration) -> grpc.aio.AioRpcError:
        async def requests() -> AsyncIterator[pb.ServeToolsRequest]:
            yield pb.ServeToolsRequest(registration=registration)
            await asyncio.sleep(10)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in served.stub.ServeTools(requests(), timeout=10):
                pass
        return refused.value

    error = await register(pb.WorkerRegistration(queue="bad queue!", tools=["ok", "not a name"], max_concurrent_calls=-1))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    [bad_request] = status_details(error)
    assert [v.field for v in bad_request.field_violations] == [
        "registration.queue",
        "registration.tools[1]",
        "registration.max_concurrent_calls",
    ]

    async def outputs_first() -> AsyncIterator[pb.ServeToolsRequest]:
        yield pb.ServeToolsRequest(output=pb.ToolOutput(call_id="x", output="y"))

    with pytest.raises(grpc.aio.AioRpcError) as unregistered:
        async for _ in served.stub.ServeTools(outputs_first(), timeout=10):
            pass
    assert unregistered.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_structured_output_holding_nan_is_an_error_result_and_the_stream_serves_on(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    """NaN and infinities fit in a Value and not in JSON: the call that got one has an error
    result saying so (the model reads it), and the worker's stream goes on with its next call."""

    def script(body: dict[str, Any]) -> Reply:
        done = tool_results(body)
        if done < 2:
            return Reply(calls=[("lookup", {"n": done + 1})], tokens=10)
        return Reply(text=" | ".join(m["content"] for m in body["messages"] if m["role"] == "tool"), tokens=10)

    model.script("asker", script)
    runtime_id = await create(stub, agent("asker", tools=[worker_tool("lookup", queue="typed")]))
    outputs: asyncio.Queue[pb.ServeToolsRequest] = asyncio.Queue()
    await outputs.put(pb.ServeToolsRequest(registration=pb.WorkerRegistration(queue="typed", tools=["lookup"])))

    async def requests() -> AsyncIterator[pb.ServeToolsRequest]:
        while True:
            yield await outputs.get()

    serving = stub.ServeTools(requests())
    try:
        registered = await serving.read()
        assert isinstance(registered, pb.ServeToolsResponse) and registered.HasField("registered")
        running = asyncio.ensure_future(run(stub, runtime_id, "asker", "look"))
        first = await serving.read()
        assert isinstance(first, pb.ServeToolsResponse)
        infinite = json_format.ParseDict({"hits": [1]}, pb.ToolOutput().structured)
        infinite.struct_value.fields["score"].number_value = float("inf")
        await outputs.put(pb.ServeToolsRequest(output=pb.ToolOutput(call_id=first.call.id, structured=infinite)))
        second = await serving.read()  # the same stream, still serving
        assert isinstance(second, pb.ServeToolsResponse)
        await outputs.put(pb.ServeToolsRequest(output=pb.ToolOutput(call_id=second.call.id, output="found")))
        handle_id, result = await running
    finally:
        serving.cancel()
    assert result.status == pb.STATUS_DONE, result
    tool_messages = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert [m.is_error for m in tool_messages] == [True, False]
    assert "NaN or an infinity" in tool_messages[0].content and tool_messages[1].content == "found"


async def test_a_worker_tool_definition_is_checked_at_create(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    tools = [worker_tool("a", queue=""), worker_tool("b", timeout=0), worker_tool("c", queue="x" * 65)]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create(stub, agent("planner", tools=tools))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [bad_request] = status_details(refused.value)
    assert [v.field for v in bad_request.field_violations] == [
        "agents[0].tools[0].worker.queue",
        "agents[0].tools[1].worker.timeout",
        "agents[0].tools[2].worker.queue",
    ]


WORKER_PROCESS = """
import asyncio, json, sys
from agentruntime.client import Client

async def main():
    address, queue, log = sys.argv[1:4]
    def record(arguments, call):
        with open(log, "a") as out:
            out.write(json.dumps({"key": call.call.idempotency_key, "pid": __import__("os").getpid()}) + "\\n")
        return asyncio.sleep(3600, "never")  # holds the call until killed
    async with Client(address) as client:
        await client.serve_tools(queue, {"charge": record}, registered=lambda worker: print(worker, flush=True))

asyncio.run(main())
"""


async def test_a_worker_process_killed_mid_call_leaves_the_call_to_the_next_worker(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, client: Client, served: Served, tmp_path: Path
) -> None:
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    runtime_id = await create(stub, agent("payer", tools=[worker_tool("charge")]))
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "worker.py"
    script.write_text(WORKER_PROCESS)
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), f"127.0.0.1:{served.running.port}", "tools", str(log),
        stdout=asyncio.subprocess.PIPE, env={**os.environ},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        await asyncio.wait_for(process.stdout.readline(), 30)  # registered
        handle_id = await spawn(stub, runtime_id, "payer")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
        await until(lambda: log.exists() and bool(log.read_text()), "the worker process to hold the call")
        process.send_signal(signal.SIGKILL)
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    second: list[str] = []

    def charge(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        second.append(call.call.idempotency_key)
        return "ok"

    async with serving(client, "tools", {"charge": charge}):
        result = await wait(stub, runtime_id, handle_id)
    [first] = [json.loads(line)["key"] for line in log.read_text().splitlines()]
    assert result.status == pb.STATUS_DONE and second == [first] == [f"{runtime_id}/{handle_id}/call_1_1"]


async def test_a_call_out_at_a_worker_when_the_server_dies_goes_to_a_worker_again_after_the_restart(
    process: ServerProcess, model: ScriptedModelServer
) -> None:
    """The journal has the call started and no result: after a SIGKILL and a restart it is
    in doubt, and RETRY sends it again, with the same key, to the worker that reconnected."""
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    stub = await process.start()
    runtime_id = await create(stub, agent("payer", tools=[worker_tool("charge")]))
    keys: list[str] = []
    first_call = asyncio.Event()

    async def charge(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        keys.append(call.call.idempotency_key)
        if len(keys) == 1:
            first_call.set()
            await asyncio.sleep(3600)  # the server dies while the call is out
        return "charged"

    async with Client(process.address) as worker_client:
        serving_task = asyncio.ensure_future(worker_client.serve_tools("tools", {"charge": charge}, backoff=0.05))
        try:
            handle_id = await spawn(stub, runtime_id, "payer")
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
            await asyncio.wait_for(first_call.wait(), 30)
            await process.stop(signal.SIGKILL)
            stub = await process.restart()  # the worker reconnects by itself
            result = await wait(stub, runtime_id, handle_id)
        finally:
            serving_task.cancel()
            await asyncio.gather(serving_task, return_exceptions=True)
    assert (result.status, result.text) == (pb.STATUS_DONE, "charged")
    assert keys == [f"{runtime_id}/{handle_id}/call_1_1"] * 2


async def test_a_graceful_stop_ends_the_worker_streams_at_once(process: ServerProcess) -> None:
    """SIGTERM: the server does not wait out its grace for streams that never end by
    themselves; its workers are told to go (and reconnect elsewhere)."""
    await process.start()
    registrations: list[str] = []
    async with Client(process.address) as worker_client:
        task = asyncio.ensure_future(
            worker_client.serve_tools("tools", {"noop": lambda arguments, call: ""}, registered=registrations.append)
        )
        try:
            await until(lambda: bool(registrations), "the worker to register")
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await process.stop(signal.SIGTERM) == 0
            assert loop.time() - started < 3  # AGENTRUNTIME_SHUTDOWN_GRACE is 5 s here
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class HeldJwks(JwksServer):
    """While `holding`, each fetch waits until the test releases it (an identity provider slow to answer)."""

    def __init__(self, keys: list[dict[str, Any]]) -> None:
        super().__init__(keys)
        self.holding = False
        self.held: list[asyncio.Future[None]] = []

    async def jwks(self, request: web.Request) -> web.Response:
        if self.holding:
            answer = asyncio.get_running_loop().create_future()
            self.held.append(answer)
            await answer
        return await super().jwks(request)

    def release(self) -> None:
        self.held.pop(0).set_result(None)


class HeldModel(ScriptedModelServer):
    """Every request waits for `go`."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = 0
        self.go = asyncio.Event()

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.arrived += 1
        await self.go.wait()
        return await super()._complete(request)


async def test_a_call_whose_deadline_passes_while_its_stream_checks_the_credential_is_never_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream took the call and verifies its host's credential again before sending it; the
    identity provider is slow, and the call's deadline passes meanwhile. The call never left the
    process: it is not in doubt (it fails as taken by none), and the stream never sends it."""
    monkeypatch.setattr(jwt_auth, "JWKS_LIFESPAN_SECONDS", 1e-6)  # every check fetches the JWKS
    key = ec.generate_private_key(ec.SECP256R1())
    jwks, model = HeldJwks([public_jwk(key, "es-1", "ES256")]), HeldModel()
    await jwks.start()
    await model.start()
    model.script("payer", calls_then_answer(("charge", {})))
    metadata = bearer(sign(key, kid="es-1", alg="ES256"))
    settings: dict[str, Any] = {"auth_jwks": jwks.url, "auth_issuer": ISSUER, "auth_audience": AUDIENCE}
    try:
        async with serve(auth="jwt", llm_style="openai", llm_base_url=model.base_url, **settings) as served:
            payer = agent("payer", tools=[worker_tool("charge", timeout=3)])
            await served.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="pay", agents=[payer]), metadata=metadata)
            spawned = await served.stub.Spawn(
                pb.SpawnRequest(runtime_id="pay", parent_id="root", agent="payer"), metadata=metadata
            )
            await served.stub.Wake(pb.WakeRequest(runtime_id="pay", handle_id=spawned.handle_id, prompt="pay"), metadata=metadata)

            outputs: asyncio.Queue[pb.ServeToolsRequest | None] = asyncio.Queue()
            await outputs.put(pb.ServeToolsRequest(registration=pb.WorkerRegistration(queue="tools", tools=["charge"])))

            async def requests() -> AsyncIterator[pb.ServeToolsRequest]:
                while (request := await outputs.get()) is not None:
                    yield request

            stream = served.stub.ServeTools(requests(), metadata=metadata, timeout=60)
            received: list[pb.ServeToolsResponse] = []

            async def read() -> bool:
                response = await stream.read()
                if isinstance(response, pb.ServeToolsResponse):
                    received.append(response)
                return response is not grpc.aio.EOF

            await read()  # registered
            pool = served.running.workers
            assert pool is not None
            [worker] = [worker for workers in pool._queues.values() for worker in workers]
            await until(lambda: model.arrived == 1, "the turn to ask the model")

            jwks.holding = True
            await until(lambda: len(jwks.held) == 1, "the idle stream to check its credential", timeout=10)
            checking = time.monotonic()  # the stream's last verification began before this
            model.go.set()
            await until(lambda: bool(worker.in_hand), "the call to be queued for the worker")
            await asyncio.sleep(max(0.0, checking + STREAM_RECHECK_SECONDS - time.monotonic()))
            jwks.release()  # the stream takes the call, and verifies the credential again first
            await until(lambda: len(jwks.held) == 1, "the stream to check its credential before sending the call")
            assert worker.outbox.empty() and worker.in_hand, "the stream should hold the call, its deadline to come"
            await until(lambda: model.calls["payer"] == 2, "the call's result to reach the model", timeout=30)
            jwks.holding = False
            jwks.release()
            await outputs.put(None)  # the host is done: the stream ends
            while await read():
                pass
    finally:
        await jwks.stop()
        await model.stop()
    [output] = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert "no worker of queue 'tools' took the call within 3s" in output, output
    assert f"the stream of worker {worker.id} did not send it" in output, output
    assert "may or may not" not in output, output
    assert [response.WhichOneof("message") for response in received] == ["registered"]


# ---- a call kept past its deadline, and a worker that leaves with a call ----------------------------


async def test_a_worker_leaving_with_a_call_it_kept_past_its_deadline_logs_no_unretrieved_exception(
    served: Served, model: ScriptedModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model.script("payer", calls_then_answer(("charge", {})))
    runtime_id = await create(served.stub, agent("payer", tools=[worker_tool("charge", timeout=0.5)]))
    held: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        held.append(call.id)
        await asyncio.sleep(3600)
        return "never"

    pool = served.running.workers
    assert pool is not None
    async with Client(f"127.0.0.1:{served.port}") as client:
        async with serving(client, "tools", {"charge": hangs}):
            _, result = await run(served.stub, runtime_id, "payer", "pay")
            assert held, "the worker should have been sent the call"
            assert result.status == pb.STATUS_DONE, result
            assert "may or may not have taken effect" in result.text, result.text
        await until(lambda: not pool._queues, "the worker to leave")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        await asyncio.sleep(0.1)  # the kept call's done callbacks run
        gc.collect()
    unretrieved = [record.getMessage() for record in caplog.records if "never retrieved" in record.getMessage()]
    assert unretrieved == [], unretrieved


async def _lost_call_result(served: Served, model: ScriptedModelServer, timeout: float, leave_when_kept: bool) -> tuple[str, str]:
    """A worker takes the call and hangs; it leaves (at once, or once the call was kept past its
    deadline); no other worker comes. The call's result, and the worker's id."""
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    runtime_id = await create(served.stub, agent("payer", tools=[worker_tool("charge", timeout=timeout)]))
    held: list[str] = []
    ids: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        held.append(call.call.idempotency_key)
        await asyncio.sleep(3600)
        return "never"

    pool = served.running.workers
    assert pool is not None
    async with Client(f"127.0.0.1:{served.port}") as client:
        async with serving(client, "tools", {"charge": hangs}) as ids:
            handle_id = await spawn(served.stub, runtime_id, "payer")
            await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
            await until(lambda: bool(held), "the worker to hold the call")
            if leave_when_kept:
                [worker] = [w for workers in pool._queues.values() for w in workers]
                await until(lambda: held[0] in worker.missed, "the call to be kept past its deadline", timeout=10)
        # The worker is gone with the call; the retry waits for another one, and none comes.
        result = await wait(served.stub, runtime_id, handle_id)
    assert result.status == pb.STATUS_DONE, result
    [tool_message] = [m for m in await transcript(served.stub, runtime_id, handle_id) if m.role == "tool"]
    assert tool_message.is_error
    return tool_message.content, ids[0]


async def test_a_call_whose_worker_went_away_and_no_other_took_says_it_may_have_taken_effect(
    served: Served, model: ScriptedModelServer
) -> None:
    output, worker_id = await _lost_call_result(served, model, 0.5, leave_when_kept=False)
    assert "no worker of queue" not in output, output
    assert output == (
        f"worker {worker_id} of queue 'tools' took the call and went away without answering, and no other "
        "worker took it within 0.5s: it may or may not have taken effect"
    ), output


async def test_a_call_kept_past_its_deadline_by_a_worker_that_then_left_says_it_may_have_taken_effect(
    served: Served, model: ScriptedModelServer
) -> None:
    output, worker_id = await _lost_call_result(served, model, 1.0, leave_when_kept=True)
    assert "no worker of queue" not in output, output
    assert output == (
        f"worker {worker_id} of queue 'tools' took the call and went away without answering, and no other "
        "worker took it within 1s: it may or may not have taken effect"
    ), output


async def test_a_call_in_doubt_again_after_the_host_had_it_run_again_asks_with_a_new_request(
    served: Served, model: ScriptedModelServer
) -> None:
    """ASK: a worker goes away with the call, the host answers `ok` without an output (run it
    again), and the next worker goes away with it too. The second in_doubt Request must not
    reuse the first one's id: a retry of the first Resume (its reply lost on the way) would be
    read as an answer to the second, and run the call a third time; the README says a retried
    Resume returns the same result and runs nothing."""
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    charge = worker_tool("charge", timeout=5, on_interrupted=pb.ON_INTERRUPTED_ASK)
    runtime_id = await create(served.stub, agent("payer", tools=[charge]))
    held: list[str] = []

    async def hangs(arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        held.append(call.call.idempotency_key)
        await asyncio.sleep(3600)
        return "never"

    async with Client(f"127.0.0.1:{served.port}") as client:
        async with serving(client, "tools", {"charge": hangs}):
            handle_id = await spawn(served.stub, runtime_id, "payer")
            await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="pay"))
            await until(lambda: len(held) == 1, "the first worker to hold the call")
        first = await wait(served.stub, runtime_id, handle_id)
        assert (first.status, first.pending.kind) == (pb.STATUS_PENDING, "in_doubt"), first
        rerun = pb.ResumeRequest(runtime_id=runtime_id, answer=pb.Answer(id=first.pending.id, ok=True))
        async with serving(client, "tools", {"charge": hangs}):
            resuming = asyncio.ensure_future(served.stub.Resume(rerun, timeout=30))
            await until(lambda: len(held) == 2, "the second worker to hold the call")
        second = (await resuming).result
        assert (second.status, second.pending.kind) == (pb.STATUS_PENDING, "in_doubt"), second
        assert second.pending.id != first.pending.id, second.pending.id
        # The host retries its first Resume: the same result, and the call is not run again.
        async with serving(client, "tools", {"charge": hangs}):
            retried = (await served.stub.Resume(rerun, timeout=30)).result
            assert (retried.status, retried.pending.id) == (pb.STATUS_PENDING, second.pending.id), retried
            assert len(held) == 2, held
            # The second Request, answered with an output, settles the call.
            output = pb.ToolOutput(call_id=second.pending.calls[0].id, output="it went through")
            answer = pb.Answer(id=second.pending.id, ok=True, outputs=[output])
            done = (await served.stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer), timeout=30)).result
    assert (done.status, done.text) == (pb.STATUS_DONE, "it went through"), done
    assert held == [f"{runtime_id}/{handle_id}/call_1_1"] * 2
