"""An http tool call cut mid-exchange is in doubt, not failed, over real HTTP: a connection lost
after the request was written, and a reply past the tool's deadline, reach the runtime as a
call in doubt (RETRY sends it again with the same Idempotency-Key, three attempts in all); a
call whose request never left (nothing listening) is a plain error result; a tool server killed
with calls in flight gets them again when back. What the runtime does with a call in doubt
(ASK's Request and its answers, the pauses, a call in doubt that stays so) is the fast tier's:
tests/domain/test_in_doubt.py. A real server, a scripted model over HTTP, tool servers on
loopback (in this process, or in a process of its own that a test kills with calls in flight)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.tools.http import UNREACHABLE

from tests.support.build import agent, create, duration, http_tool, run, spawn, transcript, wait
from tests.support.calls import wake
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.process import free_port
from tests.support.tool_server import ToolServer

MAY_HAVE = "the call may or may not have taken effect"


def calls_then_answer(*calls: tuple[str, dict[str, Any]]) -> Any:
    """One turn making `calls`, then an answer quoting their results."""

    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=list(calls), tokens=30)
        return Reply(text=" | ".join(m["content"] for m in body["messages"] if m["role"] == "tool"), tokens=20)

    return script


def charge_tool(url: str, policy: pb.OnInterrupted.ValueType = pb.ON_INTERRUPTED_UNSPECIFIED, timeout: float = 0) -> pb.ToolDef:
    tool = http_tool("charge", url)
    tool.on_interrupted = policy
    if timeout:
        tool.http.timeout.CopyFrom(duration(timeout))
    return tool


async def tool_message(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> pb.Message:
    [message] = [m for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    return message


async def test_with_retry_a_call_cut_after_its_request_is_sent_again_with_the_same_key(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    tools.cuts["charge"] = 1
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    runtime_id = await create(stub, agent("payer", tools=[charge_tool(tools.url("charge"))]))
    handle_id, result = await run(stub, runtime_id, "payer", "pay")
    assert (result.status, result.text, result.tool_calls) == (pb.STATUS_DONE, "charge ok #2", 1), result
    assert tools.keys == [f"{runtime_id}/{handle_id}/call_1_1"] * 2
    assert tools.bodies == ['{"cents": 500}'] * 2
    message = await tool_message(stub, runtime_id, handle_id)
    assert (message.content, message.is_error) == ("charge ok #2", False)


async def test_with_retry_three_attempts_past_the_deadline_say_it_may_have_taken_effect(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    tools.delays["charge"] = 30
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    tool = charge_tool(tools.url("charge"), pb.ON_INTERRUPTED_RETRY, timeout=0.3)
    runtime_id = await create(stub, agent("payer", tools=[tool]))
    handle_id, result = await run(stub, runtime_id, "payer", "pay")
    assert result.status == pb.STATUS_DONE, result  # the model is told, and goes on
    assert tools.keys == [f"{runtime_id}/{handle_id}/call_1_1"] * 3
    message = await tool_message(stub, runtime_id, handle_id)
    assert message.is_error
    assert message.content == (
        f"no answer in 3 attempts with the same Idempotency-Key (no reply within 0.3s of sending the request): {MAY_HAVE}"
    )


async def test_a_refused_connection_is_a_plain_error_result_tried_once(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer
) -> None:
    model.script("payer", calls_then_answer(("charge", {"cents": 500})))
    runtime_id = await create(stub, agent("payer", tools=[charge_tool(f"http://127.0.0.1:{free_port()}/charge")]))
    handle_id, result = await run(stub, runtime_id, "payer", "pay")
    assert (result.status, result.text) == (pb.STATUS_DONE, UNREACHABLE), result
    message = await tool_message(stub, runtime_id, handle_id)
    assert (message.content, message.is_error) == (UNREACHABLE, True)  # not "no answer in 3 attempts"


HELD_TOOL = """
import asyncio, sys

async def hold(reader, writer):
    head = await reader.readuntil(b"\\r\\n\\r\\n")
    length = next(int(l.split(b":")[1]) for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    key = next(l.split(b":", 1)[1].strip() for l in head.split(b"\\r\\n") if l.lower().startswith(b"idempotency-key:"))
    print(key.decode(), flush=True)
    await asyncio.Event().wait()  # holds the call until the process is killed

async def main():
    server = await asyncio.start_server(hold, "127.0.0.1", int(sys.argv[1]))
    print("listening", flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


async def test_a_tool_server_killed_with_calls_in_flight_gets_them_again_with_the_same_keys_when_back(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """Three calls of one turn held by a tool server in a process of its own, SIGKILLed; a
    tool server back on the same port within the 1 s pause gets each again, with its key."""
    port = free_port()
    script = tmp_path / "held_tool.py"
    script.write_text(HELD_TOOL)
    model.script("payer", calls_then_answer(*(("charge", {"cents": cents}) for cents in (100, 200, 300))))
    runtime_id = await create(stub, agent("payer", tools=[charge_tool(f"http://127.0.0.1:{port}/charge")]))
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(port), stdout=asyncio.subprocess.PIPE, env={**os.environ}
    )
    back = ToolServer()
    try:
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), 30) == b"listening\n"
        handle_id = await spawn(stub, runtime_id, "payer")
        await wake(stub, runtime_id, handle_id, "pay")
        held = [(await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip() for _ in range(3)]
        process.send_signal(signal.SIGKILL)
        await process.wait()
        await back.start(port)
        result = await wait(stub, runtime_id, handle_id)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await back.stop()
    keys = [f"{runtime_id}/{handle_id}/call_1_{n}" for n in (1, 2, 3)]
    assert sorted(held) == sorted(back.keys) == keys
    assert (result.status, result.tool_calls) == (pb.STATUS_DONE, 3), result
    assert sorted(result.text.split(" | ")) == ["charge ok #1", "charge ok #2", "charge ok #3"]
