"""A Request with an expiry lapses (the call's result is an error, the run goes on) also
after a crash and a restart, and while nothing else keeps its runtime in memory."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, http_tool, spawn, wait
from tests.support.model_server import ScriptedModelServer
from tests.support.process import ServerProcess
from tests.support.sign_in import SignInTool, crm_script, signin

__all__ = ["signin"]  # the fixture of tests/support/sign_in.py, used here


async def _pending_sign_in(stub: pb_grpc.AgentRuntimeStub, tool: SignInTool) -> tuple[str, str]:
    runtime_id = await create(stub, agent("crm", tools=[http_tool("crm_login", tool.url())]))
    handle_id = await spawn(stub, runtime_id, "crm")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="log in"))
    assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_PENDING
    return runtime_id, handle_id


async def _lapses(stub: pb_grpc.AgentRuntimeStub, runtime_id: str, model: ScriptedModelServer, within: float) -> None:
    """The Request lapses on its own: the model is called again without any RPC on the runtime."""
    deadline = time.monotonic() + within
    while model.calls["crm"] < 2:
        assert time.monotonic() < deadline, "the expired Request did not lapse"
        await asyncio.sleep(0.1)
    rows = (await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes
    assert next(row for row in rows if row.runtime_id == runtime_id).suspended_count == 0


async def test_an_expiring_request_lapses_after_a_crash_and_a_restart(
    process: ServerProcess, model: ScriptedModelServer, signin: SignInTool
) -> None:
    signin.expires_in = 3.0
    model.script("crm", crm_script)
    stub = await process.start()
    runtime_id, _ = await _pending_sign_in(stub, signin)
    await process.stop(signal.SIGKILL)
    stub = await process.restart()
    await _lapses(stub, runtime_id, model, within=10)


async def test_an_expiring_request_keeps_its_runtime_in_memory_until_it_lapses(
    tmp_path: Path, model: ScriptedModelServer, signin: SignInTool
) -> None:
    signin.expires_in = 3.0
    model.script("crm", crm_script)
    process = ServerProcess(tmp_path / "s.db", model.base_url, tmp_path / "server.log", env={"AGENTRUNTIME_RUNTIME_CACHE": "1"})
    stub = await process.start()
    try:
        runtime_id, _ = await _pending_sign_in(stub, signin)
        await create(stub, agent("other"))  # the cache holds one idle runtime: an idle one would leave memory
        await _lapses(stub, runtime_id, model, within=10)
    finally:
        await process.stop()
