"""Request ids through a crash (issue #29): the server is SIGKILLed after a call's effect is
committed and before its answer leaves (the fault point AGENTRUNTIME_TEST_KILL_AFTER_COMMIT);
the call sent again, with its request id, to the restarted server gets the first answer, and
the effect happened once."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, transcript, views
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.process import ServerProcess


def killing(tmp_path: Path, model: ScriptedModelServer, rpc: str) -> ServerProcess:
    env = {"AGENTRUNTIME_TEST_KILL_AFTER_COMMIT": f'["{rpc}"]'}
    return ServerProcess(tmp_path / "store" / "a.db", model.base_url, tmp_path / "server.log", env)


async def lost(server: ServerProcess, call: Awaitable[object]) -> None:
    """The call's answer never comes: its server died once the effect was committed."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    assert server.process is not None
    assert await server.process.wait() == -signal.SIGKILL
    server.env = {}  # restarted without the fault


async def test_a_wake_answered_by_a_dead_server_is_answered_again_and_runs_once(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    model.script("worker", lambda body: Reply(text="done", tokens=5, delay=0.2))
    server = killing(tmp_path, model, "Wake")
    stub = await server.start()
    runtime_id = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[agent("worker")]))).runtime_id
    handle_id = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="worker"))).handle_id
    wake = pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go", request_id=str(uuid.uuid4()))
    await lost(server, stub.Wake(wake, timeout=30))

    stub = await server.restart()
    try:
        assert await stub.Wake(wake, timeout=30) == pb.WakeResponse(queued=True)  # not HANDLE_RUNNING, not a second run
        result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=30)).result
        assert (result.status, result.turns, result.own_tokens) == (pb.STATUS_DONE, 1, 5)
        messages = await transcript(stub, runtime_id, handle_id)
        assert [m.role for m in messages] == ["user", "assistant"]  # one prompt: woken once
        assert (await stub.Wake(wake, timeout=30)) == pb.WakeResponse(queued=True)  # settled since: the same answer
        assert [m.role for m in await transcript(stub, runtime_id, handle_id)] == ["user", "assistant"]
    finally:
        await server.stop()


async def test_a_create_and_a_spawn_answered_by_a_dead_server_made_one_of_each(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    server = killing(tmp_path, model, "CreateRuntime")
    stub = await server.start()
    create = pb.CreateRuntimeRequest(agents=[agent("lead")], request_id=str(uuid.uuid4()))  # the server chooses the id
    await lost(server, stub.CreateRuntime(create, timeout=30))

    server.env = {"AGENTRUNTIME_TEST_KILL_AFTER_COMMIT": '["Spawn"]'}
    stub = await server.restart()
    runtime_id = (await stub.CreateRuntime(create, timeout=30)).runtime_id
    spawn = pb.SpawnRequest(runtime_id=runtime_id, agent="lead", request_id=str(uuid.uuid4()))
    await lost(server, stub.Spawn(spawn, timeout=30))

    stub = await server.restart()
    try:
        assert (await stub.CreateRuntime(create, timeout=30)).runtime_id == runtime_id
        listed = await stub.ListRuntimes(pb.ListRuntimesRequest(), timeout=30)
        assert [r.runtime_id for r in listed.runtimes] == [runtime_id]  # one runtime, not two
        assert (await stub.Spawn(spawn, timeout=30)).handle_id == "root/lead.1"  # not root/lead.2
        assert list(await views(stub, runtime_id)) == ["root/lead.1"]
    finally:
        await server.stop()
