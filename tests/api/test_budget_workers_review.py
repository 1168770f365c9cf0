"""Review fixes: a subtree's tool calls never pass an ancestor's max_tool_calls, however many
children run at once (calls are counted from when they start); a worker that misses a
call's deadline keeps it in hand (its max_concurrent_calls holds) and never gets it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import Tree, replay

from tests.api.test_workers import serving
from tests.support.build import agent, create, duration, http_tool, run, transcript, views
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.servers import Served
from tests.support.tool_server import ToolServer

# ---- worker deadlines ---------------------------------------------------------------------


def worker_tool(name: str, timeout: float) -> pb.ToolDef:
    tool = pb.ToolDef(name=name, description=f"the {name} tool", worker=pb.WorkerTool(queue="tools"))
    tool.worker.timeout.CopyFrom(duration(timeout))
    return tool


@pytest.fixture
async def client(served: Served) -> AsyncIterator[Client]:
    async with Client(f"127.0.0.1:{served.running.port}") as made:
        yield made


def one_call_then_echo(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("slow", {})])
    return Reply(text=next(m["content"] for m in body["messages"] if m["role"] == "tool"))


async def test_a_worker_that_misses_the_deadline_keeps_the_call_in_hand_and_never_gets_it_again(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, client: Client
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
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, client: Client
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


# ---- max_tool_calls over a subtree that delegates -------------------------------------------


def pings(count: int, delay: float = 0.0) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("ping", {})] * count, delay=delay)
        return Reply(text="pinged")

    return script


def delegates(*prompts: str) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": prompt.split(":")[0], "prompt": prompt}) for prompt in prompts])
        return Reply(text="done")

    return script


async def subtree_tool_calls(stub: pb_grpc.AgentRuntimeStub, runtime_id: str) -> int:
    return sum(view.tool_calls for view in (await views(stub, runtime_id)).values())


async def test_children_running_at_once_never_pass_their_ancestors_tool_call_budget(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    model.script("lead", delegates("w:a", "w:b"))
    model.script("w", pings(3))
    tools.delay = 0.2
    runtime_id = await create(
        stub,
        agent("lead", team=["w"], budget=pb.Budget(max_tool_calls=3)),
        agent("w", tools=[http_tool("ping", tools.url("ping"))]),
    )
    handle_id, result = await run(stub, runtime_id, "lead", "go")
    # The two task calls count from when they start: one ping is left for both children.
    assert tools.hits["ping"] == 1
    assert await subtree_tool_calls(stub, runtime_id) == 3
    assert (result.status, result.tool_calls) == (pb.STATUS_DONE, 2)  # the lead's own figures, as documented
    children = [view for key, view in (await views(stub, runtime_id)).items() if key != handle_id]
    # Each child had calls refused (the lead's budget binds): each stops at the limit, and the
    # lead's model reads both results.
    assert [view.last_status for view in children] == [pb.STATUS_INCOMPLETE] * 2
    outputs = [m.content for m in await transcript(stub, runtime_id, handle_id) if m.role == "tool"]
    assert len(outputs) == 2 and all("LIMIT_MAX_TOOL_CALLS" in output for output in outputs), outputs


async def test_a_task_call_counts_while_its_child_runs(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    model.script("lead", delegates("w:a"))
    model.script("w", pings(2))
    runtime_id = await create(
        stub,
        agent("lead", team=["w"], budget=pb.Budget(max_tool_calls=2)),
        agent("w", tools=[http_tool("ping", tools.url("ping"))]),
    )
    handle_id, result = await run(stub, runtime_id, "lead", "go")
    assert tools.hits["ping"] == 1 and await subtree_tool_calls(stub, runtime_id) == 2
    child = next(view for key, view in (await views(stub, runtime_id)).items() if key != handle_id)
    assert (child.budget.max_tool_calls, child.tool_calls, child.last_status) == (1, 1, pb.STATUS_INCOMPLETE)
    assert (result.status, result.tool_calls) == (pb.STATUS_DONE, 1)


async def test_a_call_out_to_the_host_counts_until_answered_and_replay_rebuilds_the_count(
    served: Served, model: ScriptedModelServer, tools: ToolServer
) -> None:
    stub = served.stub
    model.script("lead", delegates("asker:a", "w:b"))
    model.script("asker", lambda body: Reply(calls=[("fetch", {})]) if tool_results(body) == 0 else Reply(text="fetched"))
    model.script("w", pings(3, delay=0.3))  # after the asker's call is out to the host
    relay = pb.ToolDef(name="fetch", description="the host's fetch", relay=pb.RelayTool())
    runtime_id = await create(
        stub,
        agent("lead", team=["asker", "w"], budget=pb.Budget(max_tool_calls=3)),
        agent("asker", tools=[relay]),
        agent("w", tools=[http_tool("ping", tools.url("ping"))]),
    )
    handle_id, pending = await run(stub, runtime_id, "lead", "go")
    assert pending.status == pb.STATUS_PENDING and pending.pending.kind == "tool_call"
    assert tools.hits["ping"] == 0  # two task calls and the relay call out: nothing left
    # The calls under way are derived from the journal: a replay rebuilds them exactly.
    runtime = await served.running.service.runtime(runtime_id)
    stored = await served.running.store.load(runtime_id)
    assert stored is not None
    rebuilt = Tree(runtime_id, stored.agents)
    replay(rebuilt, stored.entries)

    def under_way(tree: Tree) -> dict[str, tuple[frozenset[str], int]]:
        return {key: (handle.calls_out, handle.subtree_calls_out) for key, handle in tree.handles.items()}

    assert under_way(rebuilt) == under_way(runtime.tree)
    assert runtime.tree.handles[handle_id].subtree_calls_out == 2  # the task call still waiting, and the relay call
    answer = pb.Answer(
        id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=pending.pending.calls[0].id, output="fetched")]
    )
    done = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer), timeout=30)).result
    assert done.status == pb.STATUS_DONE
    assert await subtree_tool_calls(stub, runtime_id) == 3
    assert all(count == 0 for _, count in under_way(runtime.tree).values())
