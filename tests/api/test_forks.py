"""ForkRuntime: a runtime cut at any event of another's journal, replayed and never executed
(no model call, no tool call), that goes on from there on its own: its tool calls under keys
of its own, its figures the source's at the cut plus its own spend, and the source never
written to (docs/fork-and-replay.md)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, create, spawn, status_details, transcript, views
from tests.support.forks import LEAD, definitions, events, figures_at, finish, journal_json, last_seq, script
from tests.support.mcp import Calc, calc, call_then_answer
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.servers import Served, serve
from tests.support.tool_server import ToolServer

__all__ = ["calc"]  # a fixture of tests/support/mcp.py, used here


@pytest.fixture
async def sqlite_served(model: ScriptedModelServer, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(
        llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", store=f"sqlite:///{tmp_path / 'store.db'}"
    ) as served:
        yield served


def _journal(path: Path, runtime_id: str) -> list[tuple[int, bytes]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return list(db.execute("SELECT seq, step FROM journal WHERE runtime_id = ? ORDER BY seq", (runtime_id,)))


async def _recorded(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer) -> str:
    script(model)
    runtime_id = await create(stub, *definitions(tools))
    await spawn(stub, runtime_id, "lead")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=LEAD, prompt="ship it"))
    result = await finish(stub, runtime_id)
    assert (result.status, result.text, result.total_tokens) == (pb.STATUS_DONE, "lead done", 11 + 12 + 13 + 14 + 20 + 24), result
    assert tools.hits == {"fetch": 3, "commit": 1}
    return runtime_id


async def _one_run(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> tuple[str, str]:
    """A runtime whose one handle ran once, to its end: (its id, the handle's)."""
    model.script("a", lambda body: Reply(text="done", tokens=3))
    source = await create(stub, agent("a"))
    handle = await spawn(stub, source, "a")
    await stub.Wake(pb.WakeRequest(runtime_id=source, handle_id=handle, prompt="go"))
    await stub.Wait(pb.WaitRequest(runtime_id=source, handle_id=handle), timeout=30)
    return source, handle


async def test_a_fork_at_every_event_holds_the_source_as_it_was_there_and_goes_on_alone(
    sqlite_served: Served, model: ScriptedModelServer, tools: ToolServer, tmp_path: Path
) -> None:
    stub = sqlite_served.stub
    source = await _recorded(stub, model, tools)
    last = await last_seq(stub, source)
    history = await events(stub, source, last)
    journal = _journal(tmp_path / "store.db", source)
    final = {h: await transcript(stub, source, h) for h in await views(stub, source)}
    source_keys = set(tools.keys)
    assert last == history[-1].seq and last > 30
    seq = 1
    while seq <= last:
        calls, hits = sum(model.calls.values()), sum(tools.hits.values())
        forked = await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=seq))
        fork = forked.runtime_id
        assert (sum(model.calls.values()), sum(tools.hits.values())) == (calls, hits), f"work at the fork of seq {seq}"
        assert forked.fork_seq >= seq
        cut = [event for event in history if event.seq <= forked.fork_seq]
        # The fork's events up to the cut are the source's, seq for seq.
        assert [journal_json(e) for e in await events(stub, fork, forked.fork_seq)] == [journal_json(e) for e in cut]
        expected = figures_at(cut)
        for handle_id, view in (await views(stub, fork)).items():
            figures = {name: getattr(view, name) for name in ("turns", "own_tokens", "total_tokens", "tool_calls")}
            assert figures == expected[handle_id], (seq, handle_id)
            assert view.inherited_usage.total_tokens == view.total_tokens
            messages = await transcript(stub, fork, handle_id)
            assert messages == final[handle_id][: len(messages)], (seq, handle_id)
            assert sum(m.role == "assistant" for m in messages) == view.turns
        assert sorted(forked.held_handle_ids) == sorted(
            h for h, v in (await views(stub, fork)).items() if v.state == pb.HANDLE_STATE_HELD
        )
        inspected = await stub.Inspect(pb.InspectRequest(runtime_id=fork, handle_id=LEAD))
        assert (inspected.forked_from, inspected.fork_seq) == (source, forked.fork_seq)

        keys_before = len(tools.keys)
        result = await finish(stub, fork)
        assert (result.status, result.text) == (pb.STATUS_DONE, "lead done"), (seq, result)
        handles = await views(stub, fork)
        assert result.total_tokens == sum(view.own_tokens for view in handles.values())
        assert result.total_tokens >= result.inherited_usage.total_tokens
        new_keys = tools.keys[keys_before:]
        assert all(key.startswith(f"{fork}/") for key in new_keys), (seq, new_keys)
        assert not source_keys & set(new_keys)
        seq = forked.fork_seq + 1
    assert _journal(tmp_path / "store.db", source) == journal  # the source was never written to
    assert (await stub.Wait(pb.WaitRequest(runtime_id=source, handle_id=LEAD))).result.total_tokens == 94


async def test_a_fork_at_the_approval_answered_no_finishes_the_other_way_and_runs_nothing_approved(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    source = await _recorded(stub, model, tools)
    history = await events(stub, source, await last_seq(stub, source))
    pending = next(e for e in history if e.WhichOneof("payload") == "pending" and e.pending.kind == "approval")
    request_id = pending.pending.id
    forked = await stub.ForkRuntime(
        pb.ForkRuntimeRequest(
            source_runtime_id=source, at_seq=pending.seq, answers=[pb.Answer(id=request_id, ok=False, reason="not today")]
        )
    )
    assert "root/lead.1/worker.2" in forked.held_handle_ids
    hits = dict(tools.hits)
    result = await finish(stub, forked.runtime_id)
    assert result.status == pb.STATUS_DONE and tools.hits == hits  # commit was approved in the source, denied here
    worker = await transcript(stub, forked.runtime_id, "root/lead.1/worker.2")
    assert any(m.role == "tool" and "not today" in m.content for m in worker)


async def test_a_fork_changes_a_definition_and_a_message_each_as_a_step_of_its_own(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    source = await _recorded(stub, model, tools)
    # Cut just after the lead's run started (its spawn, its state change): nothing spent yet.
    replaced = definitions(tools, lead_instructions="Lead, carefully.")[0]
    forked = await stub.ForkRuntime(
        pb.ForkRuntimeRequest(
            source_runtime_id=source, at_seq=2, agents=[replaced], messages=[pb.ForkMessage(handle_id=LEAD, text="ship it again")]
        )
    )
    view = (await stub.Inspect(pb.InspectRequest(runtime_id=forked.runtime_id, handle_id=LEAD))).handle
    assert (view.state, view.inbox_size, list(forked.held_handle_ids)) == (pb.HANDLE_STATE_IDLE, 1, [])
    assert await transcript(stub, forked.runtime_id, LEAD) == []
    before = len(model.requests)
    await stub.Wake(pb.WakeRequest(runtime_id=forked.runtime_id, handle_id=LEAD))
    result = await finish(stub, forked.runtime_id)
    assert result.status == pb.STATUS_DONE
    first = model.requests[before]
    assert first["messages"][0]["content"].startswith("Lead, carefully.")
    assert "ship it again" in first["messages"][-1]["content"]


async def test_a_fork_of_a_running_source_leaves_it_running_and_a_fork_of_a_fork_of_a_deleted_source_stands(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    model.script("slow", lambda body: Reply(text="slow done", tokens=10, delay=0.5))
    source = await create(stub, agent("slow"))
    handle = await spawn(stub, source, "slow")
    await stub.Wake(pb.WakeRequest(runtime_id=source, handle_id=handle, prompt="go"))
    forked = await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=2, runtime_id="fork-1"))
    assert list(forked.held_handle_ids) == [handle]
    done = (await stub.Wait(pb.WaitRequest(runtime_id=source, handle_id=handle), timeout=30)).result
    assert (done.status, done.turns) == (pb.STATUS_DONE, 1)
    second = await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id="fork-1", at_seq=2, runtime_id="fork-2"))
    await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=source))
    await stub.DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id="fork-1"))
    third = await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=second.runtime_id, at_seq=2, runtime_id="fork-3"))
    await stub.Wake(pb.WakeRequest(runtime_id="fork-3", handle_id=handle))
    result = (await stub.Wait(pb.WaitRequest(runtime_id="fork-3", handle_id=handle), timeout=30)).result
    assert (result.status, result.text, result.total_tokens) == (pb.STATUS_DONE, "slow done", 10)
    listed = await stub.ListRuntimes(pb.ListRuntimesRequest(forks_of="fork-2"))
    assert [(s.runtime_id, s.forked_from, s.fork_seq) for s in listed.runtimes] == [(third.runtime_id, "fork-2", 2)]
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=1))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_fork_refused_creates_nothing(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    source, handle = await _one_run(stub, model)
    last = await last_seq(stub, source, handle)
    before = len((await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes)

    async def refused(request: pb.ForkRuntimeRequest) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ForkRuntime(request)
        return caught.value

    past = await refused(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=last + 1))
    assert past.code() == grpc.StatusCode.OUT_OF_RANGE and f"last event is {last}" in (past.details() or "")
    assert (await refused(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=0))).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await refused(pb.ForkRuntimeRequest(source_runtime_id="acme:other", at_seq=1))).code() == grpc.StatusCode.NOT_FOUND
    bad_agent = agent("a", tools=[pb.ToolDef(name="t", description="t", http=pb.HttpTool(url="file:///etc/passwd"))])
    bad = await refused(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=1, agents=[bad_agent]))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert any(getattr(d, "field_violations", None) for d in status_details(bad))
    unknown = await refused(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=1, answers=[pb.Answer(id="req-x", ok=True)]))
    assert unknown.code() == grpc.StatusCode.FAILED_PRECONDITION
    nobody = await refused(
        pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=1, messages=[pb.ForkMessage(handle_id="root/zz.1", text="x")])
    )
    assert nobody.code() == grpc.StatusCode.NOT_FOUND
    taken = await refused(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=1, runtime_id=source))
    assert taken.code() == grpc.StatusCode.ALREADY_EXISTS
    assert len((await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes) == before


async def test_a_fork_with_a_request_id_is_made_once(stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer) -> None:
    source, _ = await _one_run(stub, model)
    request = pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=3, request_id="fork-once")
    first, again = await stub.ForkRuntime(request), await stub.ForkRuntime(request)
    assert first == again
    assert len((await stub.ListRuntimes(pb.ListRuntimesRequest(forks_of=source))).runtimes) == 1
    other = pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=2, request_id="fork-once")
    with pytest.raises(grpc.aio.AioRpcError) as reused:
        await stub.ForkRuntime(other)
    assert reused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_replacement_at_a_fork_may_add_mcp_servers_and_name_the_sources_agents(
    stub: pb_grpc.AgentRuntimeAsyncStub, model: ScriptedModelServer, calc: Calc
) -> None:
    model.script("helper", call_then_answer("calc__add", {"a": 2, "b": 3}))
    source = await create(stub, agent("helper"), agent("aide"))
    handle = await spawn(stub, source, "helper")
    # The replacement's team names an agent only the source defines; its MCP server is listed at the fork.
    replaced = agent("helper", team=["aide"], mcp_servers=[pb.McpServer(name="calc", url=calc.url)])
    forked = await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=1, agents=[replaced]))
    await stub.Wake(pb.WakeRequest(runtime_id=forked.runtime_id, handle_id=handle, prompt="add"))
    result = (await stub.Wait(pb.WaitRequest(runtime_id=forked.runtime_id, handle_id=handle), timeout=30)).result
    assert (result.status, result.tool_calls) == (pb.STATUS_DONE, 1)
    assert calc.meta == [{"idempotency_key": f"{forked.runtime_id}/{handle}/call_1_1"}]
    unreachable = agent("helper", mcp_servers=[pb.McpServer(name="gone", url="http://127.0.0.1:9/mcp")])
    before = len((await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ForkRuntime(pb.ForkRuntimeRequest(source_runtime_id=source, at_seq=1, agents=[unreachable]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len((await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes) == before
