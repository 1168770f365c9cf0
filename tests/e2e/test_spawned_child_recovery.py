"""A child whose Spawned step is in the journal but whose run is not (a task call's child, a
compaction's summarizer): after a restart it runs, once, and its parent gets its real result.

Both steps are appended in one event-loop tick today, so the group commit writes them
together and no SIGKILL lands between them. The store is therefore staged: the server runs
until the child's first model call is out, is killed, and its journal is cut back to end at
the child's Spawned step (or at its RunStarted), which is exactly what a kill between those
commits leaves: a prefix of the journal."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.domain.journal import RunStarted, Spawned
from agentruntime_server.store.payloads import grouped, journal_rows
from agentruntime_server.store.sqlite import SqliteStore

from tests.support.build import agent, create, http_tool, spawn, transcript, views, wait
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.poll import eventually, until
from tests.support.process import ServerProcess
from tests.support.scripts import STEPS, stepper
from tests.support.tool_server import ToolServer


async def _durable_past(store: Path | str, runtime_id: str, child_id: str, after: type[Spawned | RunStarted]) -> bool:
    """Whether the store holds the child's first `after` step and a step past it: a model call
    is no effect the journal must be durable before (only a reply or a side effect is), so the
    child's first call can be out before the group commit that holds its Spawned."""
    sqlite = SqliteStore(str(store))
    try:
        stored = await sqlite.load(runtime_id)
    finally:
        await sqlite.close()
    if stored is None:
        return False
    seqs = [e.seq for e in stored.entries if isinstance(e.step, after) and e.step.handle_id == child_id]
    return bool(seqs) and seqs[0] < stored.entries[-1].seq


async def _cut_journal(store: Path | str, runtime_id: str, child_id: str, after: type[Spawned | RunStarted]) -> None:
    """Drops every journal entry after the child's first `after` step."""
    sqlite = SqliteStore(str(store))
    try:
        stored = await sqlite.load(runtime_id)
    finally:
        await sqlite.close()
    assert stored is not None
    seq = next(e.seq for e in stored.entries if isinstance(e.step, after) and e.step.handle_id == child_id)
    assert seq < stored.entries[-1].seq, "the kill should land after the child's run had begun"
    # A row may hold several steps (a group commit's): the kept ones are written back as one.
    kept, _ = journal_rows(runtime_id, 1, [entry for entry in stored.entries if entry.seq <= seq])
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        db.execute("DELETE FROM journal WHERE runtime_id = ?", (runtime_id,))
        db.executemany(
            "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step, last_seq) VALUES (?, ?, ?, ?, ?, ?, ?)",
            grouped(kept),
        )


@pytest.mark.parametrize("after", [Spawned, RunStarted], ids=["spawned", "run-started"])
async def test_a_task_child_spawned_before_a_crash_runs_once_after_it(
    process: ServerProcess, model: ScriptedModelServer, after: type[Spawned | RunStarted]
) -> None:
    worker_calls: list[str] = []

    def coordinator(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "worker", "prompt": "count the widgets"})], tokens=100)
        tool = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
        return Reply(text=f"merged: {tool}", tokens=100)

    def worker(body: dict[str, Any]) -> Reply:
        worker_calls.append(last_user(body))
        return Reply(text="7 widgets", tokens=10, delay=60.0 if len(worker_calls) == 1 else 0.0)

    model.script("coordinator", coordinator)
    model.script("worker", worker)
    stub = await process.start()
    runtime_id = await create(stub, agent("coordinator", team=["worker"]), agent("worker"))
    handle_id = await spawn(stub, runtime_id, "coordinator")
    child_id = f"{handle_id}/worker.1"
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="count"))
    await until(lambda: len(worker_calls) == 1, "the child's first model call")
    await eventually(lambda: _durable_past(process.store, runtime_id, child_id, after), "the child's steps committed")
    await process.stop(signal.SIGKILL)
    await _cut_journal(process.store, runtime_id, child_id, after)

    stub = await process.restart()
    result = await wait(stub, runtime_id, handle_id)
    assert (result.status, result.text) == (pb.STATUS_DONE, "merged: 7 widgets")
    assert (result.turns, result.own_tokens, result.total_tokens, result.tool_calls) == (2, 200, 210, 1)
    # The coordinator's delegating reply was journaled: only its final one is bought again.
    assert (model.calls["coordinator"], worker_calls) == (2, ["count the widgets"] * 2)
    child = await wait(stub, runtime_id, child_id)
    assert (child.status, child.turns, child.own_tokens, child.total_tokens) == (pb.STATUS_DONE, 1, 10, 10)
    assert [m.role for m in await transcript(stub, runtime_id, child_id)] == ["user", "assistant"]  # started once
    assert sorted(await views(stub, runtime_id)) == [handle_id, child_id]  # no second child


async def test_a_summarizer_spawned_before_a_crash_runs_once_after_it(
    process: ServerProcess, model: ScriptedModelServer, tools: ToolServer
) -> None:
    summarizer_calls: list[str] = []

    def summarize(body: dict[str, Any]) -> Reply:
        summarizer_calls.append(last_user(body))
        return Reply(text="Steps so far all succeeded.", tokens=7, delay=60.0 if len(summarizer_calls) == 1 else 0.0)

    model.script("worker", stepper)
    model.script("summarizer", summarize)
    stub = await process.start()
    compaction = pb.Compaction(max_context_tokens=150, keep_last_turns=2, summarizer_agent="summarizer")
    worker = agent("worker", tools=[http_tool("step", tools.url("step"))], compaction=compaction)
    runtime_id = await create(stub, worker, agent("summarizer"))
    handle_id = await spawn(stub, runtime_id, "worker")
    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="run the steps"))
    await until(lambda: len(summarizer_calls) == 1, "the first summarizer's model call", timeout=10)
    summarizer = f"{handle_id}/summarizer.1"
    await eventually(lambda: _durable_past(process.store, runtime_id, summarizer, Spawned), "the summarizer's steps committed")
    await process.stop(signal.SIGKILL)
    await _cut_journal(process.store, runtime_id, summarizer, Spawned)

    stub = await process.restart()
    result = await wait(stub, runtime_id, handle_id)
    assert (result.status, result.text, result.tool_calls) == (pb.STATUS_DONE, "all steps done", STEPS)
    assert tools.hits["step"] == STEPS
    summarizers = [view for view in (await views(stub, runtime_id)).values() if view.agent == "summarizer"]
    summaries = [m for m in await transcript(stub, runtime_id, handle_id) if m.summary]
    # The first summarizer ran once more on the prompt it was spawned for; no second one took its turn.
    assert summarizer_calls[1] == summarizer_calls[0]
    assert summaries and len(summarizers) == len(summaries) == len(summarizer_calls) - 1
    assert [(view.turns, view.last_status) for view in summarizers] == [(1, pb.STATUS_DONE)] * len(summarizers)
    assert result.own_tokens == result.turns * 10
    assert result.total_tokens == result.own_tokens + 7 * len(summarizers)
