"""ReplayRuntime: a recorded runtime's root runs made again with other definitions, in a runtime
of their own; the tool calls the recording has answered from it, the others as the request
says; and a diff per root (docs/fork-and-replay.md#replay)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, duration, http_tool, spawn
from tests.support.forks import LEAD, definitions, finish, script
from tests.support.model_server import Reply, ScriptedModelServer, last_tool_output, last_user, tool_results
from tests.support.tool_server import ToolServer

ROOTS = 10


def _clerk(tools: ToolServer, instructions: str) -> pb.AgentDef:
    return agent("clerk", instructions=instructions, tools=[http_tool("lookup", tools.url("lookup"))])


def _script_clerk(model: ScriptedModelServer) -> None:
    def clerk(body: dict[str, Any]) -> Reply:
        v2 = "v2" in body["messages"][0]["content"]
        number = int(last_user(body).split()[-1])
        if tool_results(body) == 0:
            arguments: dict[str, Any] = {"id": number}
            if v2 and number % 2 == 0:
                arguments["deep"] = True  # another call than the recording's
            return Reply(calls=[("lookup", arguments)], tokens=10)
        return Reply(text=f"{'v2' if v2 else 'v1'}: {last_tool_output(body)}", tokens=12 if v2 else 10)

    model.script("clerk", clerk)


async def _recorded_roots(stub: pb_grpc.AgentRuntimeAsyncStub, tools: ToolServer) -> str:
    source = await create(stub, _clerk(tools, "Answer, v1."))
    for number in range(1, ROOTS + 1):
        handle = await spawn(stub, source, "clerk")
        await stub.Wake(pb.WakeRequest(runtime_id=source, handle_id=handle, prompt=f"case {number}"))
    for number in range(1, ROOTS + 1):
        result = (await stub.Wait(pb.WaitRequest(runtime_id=source, handle_id=f"root/clerk.{number}"), timeout=60)).result
        assert result.status == pb.STATUS_DONE and result.text.startswith("v1: lookup ok"), result
    return source


async def test_ten_roots_replayed_with_a_new_instruction_answer_recorded_calls_from_the_recording(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    _script_clerk(model)
    source = await _recorded_roots(stub, tools)
    assert tools.hits["lookup"] == ROOTS
    replay = await stub.ReplayRuntime(
        pb.ReplayRuntimeRequest(
            source_runtime_id=source,
            agents=[_clerk(tools, "Answer, v2.")],
            unrecorded_calls=pb.UNRECORDED_CALLS_RECORDED_ONLY,
            request_id="replay-ten",
        ),
        timeout=60,
    )
    assert tools.hits["lookup"] == ROOTS  # nothing ran: recorded calls answered, the others refused
    assert (replay.settled, len(replay.diffs), replay.changed_count) == (True, ROOTS, ROOTS)
    for number, diff in enumerate(replay.diffs, start=1):
        assert diff.handle_id == f"root/clerk.{number}"
        assert (diff.recorded.text, diff.recorded.own_tokens) == (f"v1: lookup ok #{number}", 20)
        if number % 2:
            assert list(diff.changed) == ["own_tokens", "total_tokens", "text"]
            assert diff.replayed.text == diff.recorded.text.replace("v1", "v2")  # the recorded result, fed again
        else:
            assert list(diff.changed) == ["own_tokens", "total_tokens", "text", "tool_calls"]
            assert "no result for this one" in diff.replayed.text
            assert json.loads(diff.replayed_calls[0].arguments_json) == {"id": number, "deep": True}
        assert [c.name for c in diff.recorded_calls] == [c.name for c in diff.replayed_calls] == ["lookup"]
        assert diff.replayed.own_tokens == 22
    listed = await stub.ListRuntimes(pb.ListRuntimesRequest(forks_of=source))
    assert [(s.runtime_id, s.forked_from, s.fork_seq) for s in listed.runtimes] == [(replay.runtime_id, source, 0)]
    again = await stub.ReplayRuntime(
        pb.ReplayRuntimeRequest(
            source_runtime_id=source,
            agents=[_clerk(tools, "Answer, v2.")],
            unrecorded_calls=pb.UNRECORDED_CALLS_RECORDED_ONLY,
            request_id="replay-ten",
            timeout=duration(5),
        ),
        timeout=60,
    )
    assert again == replay  # the same replay, answered again (a timeout is no part of the request)


async def test_a_replay_of_the_recordings_own_definitions_finds_no_difference(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    scripted = pb.AgentDef(
        name="echo",
        description="echoes",
        tools=[pb.ToolDef(name="ping", description="pings", http=pb.HttpTool(url="http://127.0.0.1:9/refused"))],
        script=pb.Script(
            replies=[
                pb.ScriptedReply(tool_calls=[pb.ScriptedToolCall(name="ping", arguments_json="{}")], tokens=4),
                pb.ScriptedReply(text="pinged", tokens=6),
            ]
        ),
    )
    source = await create(stub, scripted)
    for number in range(3):
        handle = await spawn(stub, source, "echo")
        await stub.Wake(pb.WakeRequest(runtime_id=source, handle_id=handle, prompt=f"go {number}"))
        await stub.Wait(pb.WaitRequest(runtime_id=source, handle_id=handle), timeout=30)
    replay = await stub.ReplayRuntime(pb.ReplayRuntimeRequest(source_runtime_id=source, request_id="same"), timeout=60)
    assert (replay.settled, replay.changed_count, [list(d.changed) for d in replay.diffs]) == (True, 0, [[], [], []])
    for diff in replay.diffs:
        assert (diff.replayed.status, diff.replayed.text, diff.replayed.total_tokens) == (pb.STATUS_DONE, "pinged", 10)
        assert diff.replayed.tool_calls == diff.recorded.tool_calls == 1


async def test_unrecorded_calls_run_live_under_the_replays_own_key_or_go_to_the_host(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    _script_clerk(model)
    source = await _recorded_roots(stub, tools)
    keys = set(tools.keys)
    live = await stub.ReplayRuntime(
        pb.ReplayRuntimeRequest(
            source_runtime_id=source, agents=[_clerk(tools, "Answer, v2.")], unrecorded_calls=pb.UNRECORDED_CALLS_LIVE
        ),
        timeout=60,
    )
    assert tools.hits["lookup"] == ROOTS + ROOTS // 2  # the even roots' new calls ran
    new = set(tools.keys) - keys
    assert len(new) == ROOTS // 2 and all(key.startswith(f"{live.runtime_id}/") for key in new)
    host = await stub.ReplayRuntime(
        pb.ReplayRuntimeRequest(
            source_runtime_id=source, agents=[_clerk(tools, "Answer, v2.")], unrecorded_calls=pb.UNRECORDED_CALLS_HOST
        ),
        timeout=60,
    )
    statuses = [d.replayed.status for d in host.diffs]
    assert statuses == [pb.STATUS_DONE if n % 2 else pb.STATUS_PENDING for n in range(1, ROOTS + 1)]
    assert all(d.replayed.pending.kind == "tool_call" for d in host.diffs[1::2])
    assert host.settled and "status" in host.diffs[1].changed


async def test_a_replay_that_outlasts_its_timeout_says_so_and_is_waited_on_again(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    script(model)
    source = await create(stub, *definitions(tools))
    await spawn(stub, source, "lead")
    await stub.Wake(pb.WakeRequest(runtime_id=source, handle_id=LEAD, prompt="ship it"))
    await finish(stub, source)
    model.script("lead", lambda body: Reply(text="slowly", tokens=3, delay=1.0))
    request = pb.ReplayRuntimeRequest(source_runtime_id=source, request_id="slow-replay", timeout=duration(0.1))
    first = await stub.ReplayRuntime(request, timeout=30)
    assert not first.settled and first.runtime_id
    request.timeout.CopyFrom(duration(30))
    second = await stub.ReplayRuntime(request, timeout=60)
    assert (second.settled, second.runtime_id) == (True, first.runtime_id)
    [diff] = second.diffs
    assert (diff.replayed.text, diff.replayed.total_tokens, list(diff.changed)) == (
        "slowly",
        3,
        ["turns", "own_tokens", "total_tokens", "text", "tool_calls"],
    )


async def test_a_replay_refused_creates_nothing(stub: pb_grpc.AgentRuntimeAsyncStub, tools: ToolServer) -> None:
    source = await create(stub, _clerk(tools, "v1"))
    before = len((await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes)
    for request, code in (
        (pb.ReplayRuntimeRequest(source_runtime_id="nope"), grpc.StatusCode.NOT_FOUND),
        (
            pb.ReplayRuntimeRequest(source_runtime_id=source, unrecorded_calls=pb.UnrecordedCalls.ValueType(9)),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.ReplayRuntimeRequest(
                source_runtime_id=source, agents=[agent("clerk", tools=[pb.ToolDef(name="t", http=pb.HttpTool(url="ftp://x"))])]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (pb.ReplayRuntimeRequest(source_runtime_id=source, timeout=duration(-1)), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ReplayRuntime(request, timeout=30)
        assert refused.value.code() == code, (request, refused.value.details())
    assert len((await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes) == before
