"""Quotas that hold for trees: delegated children count against the tenant's running-handles
quota (a handle waiting only for its children lends its slot out; one waiting for a slot is
QUEUED); a quota of handles created per minute, a quota of bytes in the store, and non-zero
defaults of all of them once authentication is on. Real servers on loopback; how many handles
work at once is measured outside the server, as the model requests it has in flight at the
scripted model server, and as List shows the handles' states. What time does to a quota (the
runs a tenant's own timers start, a queued child's wall time, the rolling minute and day) is
the fast tier's: tests/domain/test_tenancy.py moves the clock by hand."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.limits import Quotas
from agentruntime_server.settings import SHARED_QUOTAS, Settings

from tests.support.build import agent, create, spawn, transcript, views, wait
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import eventually, until
from tests.support.process import ServerProcess
from tests.support.servers import serve
from tests.support.tenants import (
    ACME,
    ACME_READER,
    ASKER,
    GLOBEX,
    Caller,
    assert_quota,
    bearer,
    refused,
    reply,
    scripted,
    tenant_server,
)

IN_FLIGHT = (pb.HANDLE_STATE_RUNNING, pb.HANDLE_STATE_QUEUED)


# ---- the DAG team ---------------------------------------------------------------------------


def dag_team(size: int, name: str = "a") -> list[pb.AgentDef]:
    """a1 .. a{size} (each its own model): each may delegate to every later one."""
    return [agent(f"{name}{k}", team=[f"{name}{j}" for j in range(k + 1, size + 1)]) for k in range(1, size + 1)]


def script_dag(model: ScriptedModelServer, size: int, delay: float, slow_leaf: float | None = None, name: str = "a") -> None:
    """Each agent delegates to every team mate at once, in its first turn, then answers: one
    Wake of a1 makes 2**(size-1) handles. Every model call takes `delay` (a1..a{size-1}) or
    `slow_leaf` (the last agent's)."""

    def script(k: int) -> Callable[[dict[str, Any]], Reply]:
        def reply(body: dict[str, Any]) -> Reply:
            if k < size and tool_results(body) == 0:
                calls = [("task", {"agent": f"{name}{j}", "prompt": f"part {j}"}) for j in range(k + 1, size + 1)]
                return Reply(calls=calls, delay=delay)
            return Reply(text=f"{name}{k} done", delay=slow_leaf if k == size and slow_leaf is not None else delay)

        return reply

    for k in range(1, size + 1):
        model.script(f"{name}{k}", script(k))


def in_flight(model: ScriptedModelServer, name: str) -> int:
    """The team's model calls the model server is answering now (a stopped run's call is cut
    off at the runtime, but its request may sleep on at the server)."""
    return sum(body["model"].startswith(name) for body in model.in_flight_bodies)


def dag_handles(size: int) -> int:
    return 1 << (size - 1)


def dag_tokens(size: int) -> int:
    """10 tokens a model call: two for each agent that delegates, one for the last agent's."""
    delegating = leaves = 1 << (size - 2)
    return 20 * delegating + 10 * leaves


class States:
    """List polled while a tree runs: the most handles seen RUNNING or QUEUED at once, and
    whether any was QUEUED."""

    def __init__(self, stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str) -> None:
        self.stub, self.runtime_id = stub, runtime_id
        self.queued_seen = 0
        self.polls = 0
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        while True:
            listed = await self.stub.List(pb.ListRequest(runtime_id=self.runtime_id))
            self.polls += 1
            self.queued_seen = max(self.queued_seen, sum(view.state == pb.HANDLE_STATE_QUEUED for view in listed.handles))
            await asyncio.sleep(0.005)  # sampling, not waiting for a condition

    @asynccontextmanager
    async def sampled(self) -> AsyncIterator[States]:
        self._task = asyncio.ensure_future(self._poll())
        try:
            yield self
        finally:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def assert_all_done(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, size: int) -> None:
    """Every handle settled DONE; each total is its own spend plus its children's totals."""
    listed = await views(stub, runtime_id)
    assert len(listed) == dag_handles(size)
    assert {(view.state, view.last_status) for view in listed.values()} == {(pb.HANDLE_STATE_IDLE, pb.STATUS_DONE)}
    for view in listed.values():
        children = [child for child in listed.values() if child.parent_id == view.handle_id]
        assert view.total_tokens == view.own_tokens + sum(child.total_tokens for child in children), view
        assert view.own_tokens == (10 if view.agent == f"a{size}" else 20), view


async def test_a_dag_team_under_a_running_handles_quota_of_4_never_works_more_than_4_handles_at_once(
    model: ScriptedModelServer,
) -> None:
    size = 7  # 64 handles from one Wake
    script_dag(model, size, delay=0.03)
    async with serve(llm_style="openai", llm_base_url=model.base_url, quota_running_handles=4) as served:
        stub = served.stub
        runtime_id = await create(stub, *dag_team(size))
        root = await spawn(stub, runtime_id, "a1")
        async with States(stub, runtime_id).sampled() as states:
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=root, prompt="build it"))
            result = await wait(stub, runtime_id, root)
        assert (result.status, result.text) == (pb.STATUS_DONE, "a1 done"), result
        assert result.total_tokens == dag_tokens(size) == 960
        assert model.calls.total() == 96  # each handle's turns, none bought twice
        # Never more than 4 model calls at once, and the 4 slots were used: the quota, not the
        # tree's shape, set the pace. Handles waited for a slot, and showed it.
        assert model.peak_in_flight == 4, model.peak_in_flight
        assert states.polls > 5 and states.queued_seen > 0, (states.polls, states.queued_seen)
        await assert_all_done(stub, runtime_id, size)
        assert served.running.service.running_slots("default") == (0, 0)  # every slot given back

        # The same tree without the quota: the measure above can see more than 4 at once.
        model.peak_in_flight = 0
    async with serve(llm_style="openai", llm_base_url=model.base_url) as served:
        runtime_id = await create(served.stub, *dag_team(size))
        root = await spawn(served.stub, runtime_id, "a1")
        await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=root, prompt="build it"))
        assert (await wait(served.stub, runtime_id, root)).total_tokens == 960
        assert model.peak_in_flight > 4, model.peak_in_flight


async def test_a_quota_of_1_runs_a_tree_one_handle_at_a_time_without_deadlock(model: ScriptedModelServer) -> None:
    """Every waiting parent lends its slot to the children it waits for: even one slot is enough."""
    size = 4
    script_dag(model, size, delay=0.01)
    async with serve(llm_style="openai", llm_base_url=model.base_url, quota_running_handles=1) as served:
        runtime_id = await create(served.stub, *dag_team(size))
        root = await spawn(served.stub, runtime_id, "a1")
        await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=root, prompt="build it"))
        result = await wait(served.stub, runtime_id, root)
        assert (result.status, result.total_tokens) == (pb.STATUS_DONE, dag_tokens(size)), result
        assert model.peak_in_flight == 1
        await assert_all_done(served.stub, runtime_id, size)
        assert served.running.service.running_slots("default") == (0, 0)


async def test_an_interrupt_or_close_of_a_tree_with_queued_handles_settles_it_and_frees_every_slot(
    model: ScriptedModelServer,
) -> None:
    size = 5
    async with serve(llm_style="openai", llm_base_url=model.base_url, quota_running_handles=2) as served:
        stub, service = served.stub, served.running.service
        for stop in ("interrupt", "close"):
            script_dag(model, size, delay=0.01, slow_leaf=30, name=stop)  # the leaves hold the slots until stopped
            runtime_id = await create(stub, *dag_team(size, stop))
            root = await spawn(stub, runtime_id, f"{stop}1")
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=root, prompt="build it"))

            async def queued_behind_leaves(runtime_id: str = runtime_id, stop: str = stop) -> bool:
                listed = await views(stub, runtime_id)
                queued = sum(view.state == pb.HANDLE_STATE_QUEUED for view in listed.values())
                return service.running_slots("default")[1] > 0 and in_flight(model, stop) == 2 and queued > 0

            await eventually(queued_behind_leaves, "the two slots taken by leaves and others queued behind them", timeout=20)
            assert service.running_slots("default")[0] == 2
            if stop == "interrupt":
                await stub.Interrupt(pb.InterruptRequest(runtime_id=runtime_id, handle_id=root))
                assert (await wait(stub, runtime_id, root)).status == pb.STATUS_INTERRUPTED
                settled = {pb.HANDLE_STATE_IDLE}
            else:
                await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=root, force=True))
                settled = {pb.HANDLE_STATE_CLOSED}
            listed = await views(stub, runtime_id)
            assert {view.state for view in listed.values()} == settled, [(v.handle_id, v.state) for v in listed.values()]
            assert service.running_slots("default") == (0, 0), stop  # none leaked, nobody left waiting

        # The two slots serve the next tree in full: two model calls at once again.
        script_dag(model, 3, delay=0.2, name="next")
        runtime_id = await create(stub, *dag_team(3, "next"))
        root = await spawn(stub, runtime_id, "next1")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=root, prompt="again"))
        peak = 0
        while (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=root))).handle.state in IN_FLIGHT:
            peak = max(peak, in_flight(model, "next"))
            await asyncio.sleep(0.01)  # sampling
        assert (await wait(stub, runtime_id, root)).status == pb.STATUS_DONE
        assert peak == 2


async def test_a_tree_killed_with_queued_handles_goes_on_after_a_restart_within_the_quota(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    """Slots are in memory only: a recovered run takes one like any other, and the tree ends
    with the figures of one that never stopped."""
    size = 5
    script_dag(model, size, delay=0.2)
    server = ServerProcess(
        tmp_path / "store.db", model.base_url, tmp_path / "server.log", env={"AGENTRUNTIME_QUOTA_RUNNING_HANDLES": "2"}
    )
    stub = await server.start()
    try:
        runtime_id = await create(stub, *dag_team(size))
        root = await spawn(stub, runtime_id, "a1")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=root, prompt="build it"))

        async def two_queued() -> bool:
            listed = await views(stub, runtime_id)
            return sum(view.state == pb.HANDLE_STATE_QUEUED for view in listed.values()) >= 2

        await eventually(two_queued, "two handles to queue", timeout=20)
        await server.stop()  # SIGKILL, with handles working and others QUEUED
        await until(lambda: model.in_flight == 0, what="the killed server's model calls to end")
        model.peak_in_flight = 0
        stub = await server.restart()
        result = await wait(stub, runtime_id, root)
        assert (result.status, result.total_tokens) == (pb.STATUS_DONE, dag_tokens(size)), result
        await assert_all_done(stub, runtime_id, size)
        assert model.peak_in_flight == 2
    finally:
        await server.stop()


# ---- handles per minute ---------------------------------------------------------------------


async def test_the_handles_per_minute_quota_stops_a_spawn_burst(model: ScriptedModelServer) -> None:
    async with serve(llm_style="openai", llm_base_url=model.base_url, quota_handles_per_minute=8) as served:
        stub = served.stub
        runtime_id = await create(stub, agent("lead", team=["w"]), agent("w"))
        spawns = [stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="w")) for _ in range(10)]
        outcomes = await asyncio.gather(*spawns, return_exceptions=True)
        made = [outcome for outcome in outcomes if isinstance(outcome, pb.SpawnResponse)]
        errors = [outcome for outcome in outcomes if isinstance(outcome, grpc.aio.AioRpcError)]
        assert (len(made), len(errors)) == (8, 2), outcomes
        for error in errors:
            assert_quota(error, "default", "handles_per_minute")
            assert "AGENTRUNTIME_QUOTA_HANDLES_PER_MINUTE" in (error.details() or "")
        assert len(await views(stub, runtime_id)) == 8  # a refused Spawn made nothing
        lead_rt = await create(stub, agent("lead", team=["w"]), agent("w"))
        error = await refused(stub.Spawn(pb.SpawnRequest(runtime_id=lead_rt, parent_id="root", agent="lead")))
        assert_quota(error, "default", "handles_per_minute")  # per tenant, over its runtimes


async def test_a_delegation_past_the_handles_per_minute_quota_is_an_error_result_for_the_model(
    model: ScriptedModelServer,
) -> None:
    model.script(
        "lead",
        lambda body: (
            Reply(calls=[("task", {"agent": "w", "prompt": str(n)}) for n in range(3)])
            if tool_results(body) == 0
            else Reply(text="lead done")
        ),
    )
    model.script("w", lambda body: Reply(text="w done"))
    async with serve(llm_style="openai", llm_base_url=model.base_url, quota_handles_per_minute=3) as served:
        stub = served.stub
        runtime_id = await create(stub, agent("lead", team=["w"]), agent("w"))
        root = await spawn(stub, runtime_id, "lead")  # 1 of 3: two children fit, the third does not
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=root, prompt="go"))
        result = await wait(stub, runtime_id, root)
        assert (result.status, result.text) == (pb.STATUS_DONE, "lead done"), result
        told = [(m.content, m.is_error) for m in await transcript(stub, runtime_id, root) if m.role == "tool"]
        assert sorted(is_error for _, is_error in told) == [False, False, True], told
        refusal = next(text for text, is_error in told if is_error)
        assert "not spawned" in refusal and "QUOTA_EXCEEDED" in refusal, refusal
        assert "AGENTRUNTIME_QUOTA_HANDLES_PER_MINUTE" in refusal, refusal
        assert len(await views(stub, runtime_id)) == 3


# ---- store bytes ------------------------------------------------------------------------------


async def test_the_store_bytes_quota_refuses_what_would_grow_a_full_tenants_store(tmp_path: Path) -> None:
    big = pb.AgentDef(
        name="big", description="big", instructions="x" * 30_000, script=pb.Script(replies=[pb.ScriptedReply(text="hi")])
    )
    small = pb.AgentDef(name="small", description="small", script=pb.Script(replies=[pb.ScriptedReply(text="hi")]))
    async with serve(store=f"sqlite:///{tmp_path / 'store.db'}", quota_store_bytes=20_000) as served:
        stub = served.stub
        await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="small", agents=[small, ASKER]))
        handle = await spawn(stub, "small", "small")
        await stub.Post(pb.PostRequest(runtime_id="small", handle_id=handle, text="before"))
        asking = await spawn(stub, "small", "asker")
        await stub.Wake(pb.WakeRequest(runtime_id="small", handle_id=asking, prompt="look it up"))
        pending = (await wait(stub, "small", asking)).pending
        answer = pb.Answer(id=pending.id, ok=True, outputs=[pb.ToolOutput(call_id=pending.calls[0].id, output="42")])
        # Under the quota when it came: created. Past it now: nothing that grows the store goes.
        await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="big", agents=[big]))
        refusals: list[Awaitable[Any]] = [
            stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="more", agents=[small])),
            stub.Spawn(pb.SpawnRequest(runtime_id="small", parent_id="root", agent="small")),
            stub.Post(pb.PostRequest(runtime_id="small", handle_id=handle, text="after")),
            stub.Wake(pb.WakeRequest(runtime_id="small", handle_id=handle, prompt="go")),
            stub.Resume(pb.ResumeRequest(runtime_id="small", answer=answer)),
        ]
        for call in refusals:
            error = await refused(call)
            assert_quota(error, "default", "store_bytes")
            assert "AGENTRUNTIME_QUOTA_STORE_BYTES" in (error.details() or "") and "DeleteRuntime" in (error.details() or "")
        view = (await views(stub, "small"))[handle]
        assert (view.inbox_size, view.last_status) == (1, pb.STATUS_UNSPECIFIED)  # nothing of the refused calls
        listed = await stub.ListRuntimes(pb.ListRuntimesRequest())
        assert sorted(summary.runtime_id for summary in listed.runtimes) == ["big", "small"]
        # Reads go on; a delete frees the room at once.
        await stub.Inspect(pb.InspectRequest(runtime_id="small", handle_id=handle))
        await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id="big"))
        await stub.Wake(pb.WakeRequest(runtime_id="small", handle_id=handle, prompt="go"))
        assert (await wait(stub, "small", handle)).status == pb.STATUS_DONE
        resumed = await stub.Resume(pb.ResumeRequest(runtime_id="small", answer=answer))
        assert (resumed.result.status, resumed.result.text) == (pb.STATUS_DONE, "answered")


# ---- defaults with authentication on, and the tokens file --------------------------------


def write_tokens(path: Path, quotas: dict[str, dict[str, int]]) -> None:
    entries = []
    for tenant, token, scopes, name in (ACME, GLOBEX):
        entry: dict[str, Any] = {
            "tenant": tenant,
            "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
            "scopes": scopes,
            "name": name,
        }
        if tenant in quotas:
            entry["quotas"] = quotas[tenant]
        entries.append(entry)
    path.write_text(json.dumps(entries))


async def test_the_watch_streams_quota_refuses_the_next_watch_and_a_closed_stream_frees_its_place(tmp_path: Path) -> None:
    """A tenant's Watch streams open at once, read-only tokens' too: the next is refused with
    a QuotaFailure naming the quota, another tenant's are not counted, and a stream that ends
    (cancelled by its client, or by its runtime's delete) gives its place back."""
    async with tenant_server(tmp_path, quota_watch_streams=3) as served:
        acme, globex, reader = Caller(served.stub, ACME), Caller(served.stub, GLOBEX), Caller(served.stub, ACME_READER)
        solo = scripted("solo", reply("hi"))
        for caller in (acme, globex):
            for runtime_id in ("rt", "other"):
                await caller("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[solo]))
                await caller("Spawn", pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="solo"))

        async def opened(caller: Caller, runtime_id: str = "rt") -> grpc.aio.UnaryStreamCall[Any, Any]:
            call = served.stub.Watch(pb.WatchRequest(runtime_id=runtime_id), metadata=bearer(caller.token), timeout=30)
            first = await call.read()
            assert isinstance(first, pb.WatchResponse) and first.event.seq == 1  # following the runtime
            return call

        streams = [await opened(acme), await opened(reader), await opened(acme, "other")]  # one runtime or several
        tenancy = served.running.service.tenancy
        assert tenancy.streams("watch_streams", "acme") == 3
        for caller in (acme, reader):
            error = await refused(opened(caller))
            assert_quota(error, "acme", "watch_streams")
            assert "AGENTRUNTIME_QUOTA_WATCH_STREAMS" in (error.details() or "")
        assert tenancy.streams("watch_streams", "acme") == 3  # a refused Watch holds nothing
        others = [await opened(globex) for _ in range(3)]  # globex has its own three
        streams[0].cancel()
        await until(
            lambda: tenancy.streams("watch_streams", "acme") == 2, "the cancelled stream's place to be given back", timeout=10
        )
        streams[0] = await opened(reader)
        await acme("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id="other"))  # ends its watcher's stream: NOT_FOUND
        assert (await refused(streams[2].read())).code() == grpc.StatusCode.NOT_FOUND
        await until(
            lambda: tenancy.streams("watch_streams", "acme") == 2,
            "the deleted runtime's stream's place to be given back",
            timeout=10,
        )
        streams[2] = await opened(acme)
        for call in streams + others:
            call.cancel()
        await until(
            lambda: not tenancy.streams("watch_streams", "acme") and not tenancy.streams("watch_streams", "globex"),
            "every place back",
        )


async def test_the_worker_streams_quota_refuses_the_next_registration_and_a_closed_stream_frees_its_place(
    tmp_path: Path,
) -> None:
    """ServeTools streams of a tenant open at once (each holds its registration and its
    calls, and wakes every second to check its credential): past the quota a registration is
    refused with a QuotaFailure, another tenant's are not counted, and one that ends gives its
    place back."""
    async with tenant_server(tmp_path, quota_worker_streams=2) as served:
        acme, globex = Caller(served.stub, ACME), Caller(served.stub, GLOBEX)

        async def registered(caller: Caller, queue: str = "tools") -> grpc.aio.StreamStreamCall[Any, Any]:
            async def requests() -> AsyncIterator[pb.ServeToolsRequest]:
                yield pb.ServeToolsRequest(registration=pb.WorkerRegistration(queue=queue))
                await asyncio.sleep(60)

            call = served.stub.ServeTools(requests(), metadata=bearer(caller.token), timeout=30)
            first = await call.read()
            assert isinstance(first, pb.ServeToolsResponse) and first.HasField("registered")
            return call

        workers = [await registered(acme), await registered(acme, "other")]
        tenancy = served.running.service.tenancy
        error = await refused(registered(acme))
        assert_quota(error, "acme", "worker_streams")
        assert "AGENTRUNTIME_QUOTA_WORKER_STREAMS" in (error.details() or "")
        others = [await registered(globex) for _ in range(2)]
        assert (tenancy.streams("worker_streams", "acme"), tenancy.streams("worker_streams", "globex")) == (2, 2)
        workers[0].cancel()
        await until(lambda: tenancy.streams("worker_streams", "acme") == 1, "the place to be given back", timeout=10)
        workers[0] = await registered(acme)
        for call in workers + others:
            call.cancel()
        await until(lambda: not tenancy.streams("worker_streams", "acme"), "every place back", timeout=10)


def test_quotas_default_to_none_without_auth_and_to_a_shared_servers_with_it() -> None:
    names = [field for field in Quotas.__dataclass_fields__]
    assert {name: Settings().quota(name) for name in names} == dict.fromkeys(names, 0)
    shared = {name: Settings(auth="tokens").quota(name) for name in names}
    assert shared == {
        "runtimes": 1000,
        "running_handles": 64,
        "handles_per_minute": 600,
        "store_bytes": 1 << 30,
        "tokens_per_day": 0,
        "cost_per_day": 0,
        "watch_streams": 100,
        "worker_streams": 100,
    }
    assert shared == SHARED_QUOTAS and {name: Settings(auth="jwt").quota(name) for name in names} == shared
    assert Settings(auth="tokens", quota_running_handles=0).quota("running_handles") == 0  # 0 set: none
    assert Settings(quota_store_bytes=5).quota("store_bytes") == 5


async def test_with_auth_on_the_default_quotas_hold_and_the_tokens_file_overrides_them_per_tenant(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, {"acme": {"handles_per_minute": 3, "running_handles": 0}})
    with caplog.at_level(logging.INFO, logger="agentruntime"):
        async with serve(auth="tokens", auth_tokens_file=str(tokens)):
            pass
    said = [record.getMessage() for record in caplog.records if "quotas per tenant" in record.getMessage()]
    assert said == [
        "quotas per tenant (the tokens file may set a tenant's own): runtimes 1000, running handles 64, "
        "tokens per day none, handles per minute 600, store bytes 1073741824, cost per day none, watch streams 100, "
        "worker streams 100"
    ]
    async with serve(auth="tokens", auth_tokens_file=str(tokens)) as served:
        assert served.running.service.services.quotas == Quotas(**SHARED_QUOTAS)
        acme, globex = Caller(served.stub, ACME), Caller(served.stub, GLOBEX)
        solo = pb.AgentDef(name="solo", description="solo", script=pb.Script(replies=[pb.ScriptedReply(text="hi")]))
        for caller in (acme, globex):
            await caller("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="rt", agents=[solo]))

        async def spawns(caller: Caller, count: int) -> list[Any]:
            return await asyncio.gather(
                *(caller("Spawn", pb.SpawnRequest(runtime_id="rt", parent_id="root", agent="solo")) for _ in range(count)),
                return_exceptions=True,
            )

        # acme's own quota: 3 handles a minute.
        outcomes = await spawns(acme, 5)
        assert sum(isinstance(outcome, pb.SpawnResponse) for outcome in outcomes) == 3, outcomes
        for error in (outcome for outcome in outcomes if not isinstance(outcome, pb.SpawnResponse)):
            assert_quota(error, "acme", "handles_per_minute")
        # globex has the shared server's default: 600 a minute, the 601st refused.
        made = 0
        for _ in range(6):
            made += sum(isinstance(outcome, pb.SpawnResponse) for outcome in await spawns(globex, 100))
        assert made == 600
        assert_quota(
            await refused(globex("Spawn", pb.SpawnRequest(runtime_id="rt", parent_id="root", agent="solo"))),
            "globex",
            "handles_per_minute",
        )
        # Running handles: the default's gate for globex, none for acme (its 0 lifts the quota).
        service = served.running.service
        gate = service.tenancy.running_gate("globex")
        assert gate is not None and gate.capacity == 64
        assert service.tenancy.running_gate("acme") is None
