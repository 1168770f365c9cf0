"""The Python client over a real server: waiting past its deadline, and a server restart
in the middle of `run()` that the caller never sees."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest
from agentruntime.client import AgentRuntimeError, Client
from agentruntime.sync import SyncClient
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.process import ServerProcess
from tests.support.servers import Served


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
