"""Loading is pure. A runtime that this server has not taken over is read (Wait, Inspect,
List, GetTranscript, Watch) without arming a timer or running anything; a verb takes it
over, and from then on it ticks and lapses on time. A runtime with a heartbeat or an
expiring Request is taken over at start, with no call at all."""

from __future__ import annotations

import asyncio
import datetime
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from aiohttp import web

from tests.support.build import agent, create, duration, http_tool, spawn, transcript, views, wait
from tests.support.loopback import Loopback
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.servers import serve

BEAT = 2.0  # seconds between heartbeats
EXPIRES_IN = 1.0  # seconds the tool's Request lives


class SignIn(Loopback):
    """HTTP 202: an `authorization` Request that expires EXPIRES_IN seconds after the call."""

    hits = 0

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/signin"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/signin", self._hit)

    async def _hit(self, request: web.Request) -> web.Response:
        self.hits += 1
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=EXPIRES_IN)
        body = {"kind": "authorization", "prompt": "sign in", "expires_at": when.isoformat().replace("+00:00", "Z")}
        return web.json_response(body, status=202)


def crm(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("crm_login", {"user": "ada"})], tokens=10)
    return Reply(text="gave up on the sign-in", tokens=10)


@pytest.fixture
async def signin() -> AsyncIterator[SignIn]:
    server = SignIn()
    await server.start()
    yield server
    await server.stop()


def settings(model: ScriptedModelServer, database: Path) -> dict[str, Any]:
    return {"llm_style": "openai", "llm_base_url": model.base_url, "llm_api_key": "sk-test", "store": f"sqlite:///{database}"}


async def _left_with_a_heartbeat_and_an_expiring_request(
    model: ScriptedModelServer, signin: SignIn, database: Path
) -> tuple[str, str, str]:
    """A runtime whose `crm` handle is suspended on an expiring Request and whose `beater`
    handle has a heartbeat, left by a server that stopped; both are due by the time this returns."""
    model.script("crm", crm)
    model.script("beater", lambda body: Reply(text="beat", tokens=1))
    async with serve(**settings(model, database)) as served:
        stub = served.stub
        runtime_id = await create(
            stub,
            agent("crm", tools=[http_tool("crm_login", signin.url())]),
            agent("beater", heartbeat=pb.Heartbeat(every=duration(BEAT), prompt="tick")),
        )
        crm_id = await spawn(stub, runtime_id, "crm")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=crm_id, prompt="log in"))
        pending = await wait(stub, runtime_id, crm_id)
        assert pending.status == pb.STATUS_PENDING and pending.pending.HasField("expires_at")
        beater_id = await spawn(stub, runtime_id, "beater")  # last: it cannot tick before the stop
        spawned = time.time()
    assert model.calls == {"crm": 1}
    # Paced, not polled: the server is down while the Request expires and the heartbeat comes due.
    due = max(pending.pending.expires_at.ToNanoseconds() / 1e9, spawned + BEAT)
    await asyncio.sleep(max(due - time.time(), 0.0) + 0.2)
    return runtime_id, crm_id, beater_id


def _journal_rows(database: Path, runtime_id: str) -> int:
    with sqlite3.connect(database) as db:
        return int(db.execute("SELECT count(*) FROM journal WHERE runtime_id = ?", (runtime_id,)).fetchone()[0])


def _last_event(database: Path, runtime_id: str) -> int:
    with sqlite3.connect(database) as db:
        return int(db.execute("SELECT max(last_event) FROM journal WHERE runtime_id = ?", (runtime_id,)).fetchone()[0])


async def _watch(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, seen: list[pb.Event]) -> None:
    with_history = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=0))
    try:
        async for response in with_history:
            seen.append(response.event)
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.CANCELLED, error


async def test_reading_a_runtime_not_taken_over_arms_nothing_and_a_verb_takes_it_over(
    tmp_path: Path, model: ScriptedModelServer, signin: SignIn
) -> None:
    database = tmp_path / "store.db"
    runtime_id, crm_id, beater_id = await _left_with_a_heartbeat_and_an_expiring_request(model, signin, database)
    # The start takes over every runtime its store flags as needing a process. This one it
    # does not find (the flag cleared, as a store no server of ours leaves it): it comes back
    # only when it is addressed.
    with sqlite3.connect(database) as db:
        db.execute("UPDATE runtimes SET running = 0 WHERE id = ?", (runtime_id,))
    rows, last_event = _journal_rows(database, runtime_id), _last_event(database, runtime_id)

    async with serve(**settings(model, database)) as served:
        stub, service = served.stub, served.running.service
        assert (service.cached, service.timers_armed) == (0, 0)

        result = await wait(stub, runtime_id, crm_id)
        assert result.status == pb.STATUS_PENDING  # as stored: the expired Request has not lapsed
        with pytest.raises(grpc.aio.AioRpcError) as never_run:
            await wait(stub, runtime_id, beater_id)
        assert never_run.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        inspected = await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=beater_id))
        assert (inspected.handle.state, inspected.handle.inbox_size) == (pb.HANDLE_STATE_IDLE, 0)  # no tick in it
        listed = await views(stub, runtime_id)
        assert listed[crm_id].state == pb.HANDLE_STATE_SUSPENDED
        assert [m.role for m in await transcript(stub, runtime_id, crm_id)] == ["user", "assistant"]
        seen: list[pb.Event] = []
        watching = asyncio.ensure_future(_watch(stub, runtime_id, seen))
        try:
            await until(lambda: bool(seen) and seen[-1].seq == last_event, "the Watch's history")
            assert service.timers_armed == 0
            # Paced: an armed heartbeat or lapse is due at once and would act within this second.
            await asyncio.sleep(1.0)
            assert service.timers_armed == 0
            assert model.calls == {"crm": 1} and signin.hits == 1
            assert _journal_rows(database, runtime_id) == rows
            assert seen[-1].seq == last_event

            # A verb takes it over: the heartbeat comes due at once, the Request lapses at once.
            posted = time.monotonic()
            await stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=beater_id, text="hello"))
            await until(lambda: model.calls["beater"] >= 1 and model.calls["crm"] >= 2, "the tick's run and the lapse", 10)
            assert time.monotonic() - posted < BEAT, "what was due waited"
            assert service.timers_armed >= 1  # the heartbeat's next tick
            lapsed = await wait(stub, runtime_id, crm_id)
            assert (lapsed.status, lapsed.text) == (pb.STATUS_DONE, "gave up on the sign-in")
            await until(lambda: model.calls["beater"] >= 2, "the next tick, a period later", 5 * BEAT)
            assert any(event.seq > last_event for event in seen)  # the watcher saw it all live
            assert signin.hits == 1  # a lapse calls the tool no more
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def test_a_runtime_with_a_heartbeat_or_an_expiring_request_is_taken_over_at_start(
    tmp_path: Path, model: ScriptedModelServer, signin: SignIn
) -> None:
    database = tmp_path / "store.db"
    runtime_id, crm_id, _ = await _left_with_a_heartbeat_and_an_expiring_request(model, signin, database)
    started = time.monotonic()
    async with serve(**settings(model, database)) as served:
        # No call addresses it: the start alone ticks it and lapses its Request.
        assert served.running.service.cached == 1
        await until(lambda: model.calls["beater"] >= 1 and model.calls["crm"] >= 2, "the tick's run and the lapse", 10)
        assert time.monotonic() - started < 5 * BEAT
        assert (await wait(served.stub, runtime_id, crm_id)).status == pb.STATUS_DONE


async def test_a_wait_on_a_handle_running_in_a_journal_no_process_runs_takes_its_runtime_over(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    """A handle RUNNING in the store goes on only once its runtime is taken over: a Wait on it
    (the start did not list it) takes it over and gets its result."""
    database = tmp_path / "store.db"
    released = asyncio.Event()

    def slow(body: dict[str, Any]) -> Reply:
        return Reply(text="done at last", tokens=5, delay=0.0 if released.is_set() else 30.0)

    model.script("slow", slow)
    async with serve(**settings(model, database)) as served:
        runtime_id = await create(served.stub, agent("slow"))
        handle_id = await spawn(served.stub, runtime_id, "slow")
        await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
        await until(lambda: model.calls["slow"] == 1, "the model call")
        await served.stop(grace=0.0)  # cut mid-call: RUNNING in the store
    released.set()
    with sqlite3.connect(database) as db:
        db.execute("UPDATE runtimes SET running = 0 WHERE id = ?", (runtime_id,))
    async with serve(**settings(model, database)) as served:
        assert served.running.service.cached == 0
        view = await served.stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))
        assert view.handle.state == pb.HANDLE_STATE_RUNNING and model.calls["slow"] == 1  # read, not continued
        result = await wait(served.stub, runtime_id, handle_id)
        assert (result.status, result.text) == (pb.STATUS_DONE, "done at last")
        assert model.calls["slow"] == 2
