"""The numbers a host bills from agree on every path: each TaskResult's figures, the
tenant's token ledger (the store's `tenant_tokens`, kept when a token quota is set),
the Prometheus turn and token counters and the Watch TurnEnded events; across a
restart that replays journals, an idle runtime evicted and loaded again, a Resume,
delegation with judges and summarizers, estimated usage, a failed provider call and a
SIGKILL with a turn in flight."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.tenancy.quotas import DAY_MINUTES
from prometheus_client.parser import text_string_to_metric_families

from tests.support.build import agent, create, http_tool, run, spawn, struct, views, wait
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import until
from tests.support.process import ServerProcess, free_port
from tests.support.servers import serve
from tests.support.tool_server import ToolServer

KEY = "sk-test-secret-never-shown"
QUOTA = 10_000_000  # high: the ledger is kept (a quota is set) and never bites


def settings(model: ScriptedModelServer, store: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "llm_style": "openai",
        "llm_base_url": model.base_url,
        "llm_api_key": KEY,
        "llm_backoff_base": 0.0,
        "store": f"sqlite:///{store}",
        "metrics_listen": "127.0.0.1:0",
        "quota_tokens_per_day": QUOTA,
        **overrides,
    }


def ledger(store: Path, tenant: str = "default") -> int:
    """The tenant's tokens as the store keeps them."""
    with contextlib.closing(sqlite3.connect(store)) as db:
        (spent,) = db.execute("SELECT COALESCE(SUM(tokens), 0) FROM tenant_tokens WHERE tenant = ?", (tenant,)).fetchone()
    return int(spent)


async def counters(port: int) -> tuple[float, float]:
    """(agentruntime_turns_total, agentruntime_tokens_total), scraped over HTTP."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    values = {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}
    return values.get("agentruntime_turns_total", 0.0), values.get("agentruntime_tokens_total", 0.0)


async def turn_ends(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str) -> list[pb.Event]:
    """Every TurnEnded of a settled runtime, from Watch's history (sent at once from the
    store: the stream then stays open for live events, so a quiet second ends the read)."""
    events: list[pb.Event] = []
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=0))
    quiet = 10.0  # the first event may take a while on a busy machine
    try:
        while True:
            response = await asyncio.wait_for(call.read(), timeout=quiet)
            quiet = 1.0
            if response is grpc.aio.EOF:
                break
            assert isinstance(response, pb.WatchResponse)
            if response.event.WhichOneof("payload") == "turn_ended":
                events.append(response.event)
    except TimeoutError:
        pass
    finally:
        call.cancel()
    return events


async def check_tree(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str) -> dict[str, pb.HandleView]:
    """Every handle's figures agree with its children's and with its TurnEnded events."""
    listed = await views(stub, runtime_id)
    for view in listed.values():
        children = [child for child in listed.values() if child.parent_id == view.handle_id]
        assert view.total_tokens == view.own_tokens + sum(child.total_tokens for child in children), view
    ends = await turn_ends(stub, runtime_id)
    for view in listed.values():
        own = [event.turn_ended for event in ends if event.handle_id == view.handle_id]
        assert len(own) == view.turns, (view, own)
        assert sum(end.tokens for end in own) == view.own_tokens, (view, own)
        if own:
            assert own[-1].own_tokens == view.own_tokens, (view, own)
    return listed


# ---- a restart that replays journals -----------------------------------------------------


async def test_a_restart_bills_only_the_turns_bought_after_it(
    tmp_path: Path, model: ScriptedModelServer, tools: ToolServer
) -> None:
    model.script("coordinator", lambda body: Reply(calls=[("task", {"agent": "worker", "prompt": "go"})], tokens=100)
                 if tool_results(body) == 0 else Reply(text="done", tokens=100))  # fmt: skip
    model.script("worker", lambda body: Reply(calls=[("slow", {})], tokens=40) if tool_results(body) == 0
                 else Reply(text="worked", tokens=40))  # fmt: skip
    tools.delays["slow"] = 1.0
    store = tmp_path / "store.db"
    worker = agent("worker", tools=[http_tool("slow", tools.url("slow"))])
    async with serve(**settings(model, store, shutdown_grace=0.1)) as first:
        await create(first.stub, agent("coordinator", team=["worker"]), worker, runtime_id="rt")
        root = await spawn(first.stub, "rt", "coordinator")
        await first.stub.Wake(pb.WakeRequest(runtime_id="rt", handle_id=root, prompt="go"))
        await until(lambda: tools.hits["slow"] == 1, "the worker's tool call")
        before = await counters(first.running.metrics_port)
        assert before == (2, 140)
        await first.stop(grace=0.1)
    async with serve(**settings(model, store)) as second:
        result = await wait(second.stub, "rt", root)
        assert result.status == pb.STATUS_DONE, result
        assert (result.turns, result.own_tokens, result.total_tokens) == (2, 200, 280)
        after = await counters(second.running.metrics_port)
        assert after == (2, 140)  # the worker's and the coordinator's second turns only
        assert ledger(store) == result.total_tokens
        await check_tree(second.stub, "rt")


# ---- an idle runtime evicted and loaded again ---------------------------------------------


async def test_an_evicted_runtime_loaded_again_bills_nothing_twice(tmp_path: Path, model: ScriptedModelServer) -> None:
    relay = pb.ToolDef(name="deploy", description="deploys", relay=pb.RelayTool())
    model.script("lead", lambda body: Reply(calls=[("deploy", {})], tokens=50) if tool_results(body) == 0
                 else Reply(text="deployed", tokens=60))  # fmt: skip
    store = tmp_path / "store.db"
    async with serve(**settings(model, store, runtime_cache=1)) as served:
        stub = served.stub
        await create(stub, agent("lead", tools=[relay]), runtime_id="one")
        _, pending = await run(stub, "one", "lead", "ship")
        assert pending.status == pb.STATUS_PENDING
        for other in ("two", "three"):  # each load evicts the idle one before it
            await create(stub, agent("lead", tools=[relay]), runtime_id=other)
        assert served.running.service.cached == 1
        call = pending.pending.calls[0]
        answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="v2 live")])
        resumed = (await stub.Resume(pb.ResumeRequest(runtime_id="one", answer=answer))).result
        assert (resumed.status, resumed.turns, resumed.own_tokens, resumed.total_tokens) == (pb.STATUS_DONE, 2, 110, 110)
        assert await counters(served.running.metrics_port) == (2, 110)
        assert ledger(store) == 110
        await check_tree(stub, "one")


# ---- Resume of a suspended child under a coordinator --------------------------------------


async def test_a_resumed_tree_bills_its_replayed_turns_once(tmp_path: Path, model: ScriptedModelServer) -> None:
    relay = pb.ToolDef(name="deploy", description="deploys", relay=pb.RelayTool())
    model.script("coordinator", lambda body: Reply(calls=[("task", {"agent": "release", "prompt": "go"})], tokens=100)
                 if tool_results(body) == 0 else Reply(text="released", tokens=100))  # fmt: skip
    model.script("release", lambda body: Reply(calls=[("deploy", {})], tokens=10) if tool_results(body) == 0
                 else Reply(text="deployed", tokens=10))  # fmt: skip
    store = tmp_path / "store.db"
    async with serve(**settings(model, store)) as served:
        stub = served.stub
        await create(stub, agent("coordinator", team=["release"]), agent("release", tools=[relay]), runtime_id="rt")
        root, pending = await run(stub, "rt", "coordinator", "ship")
        assert pending.status == pb.STATUS_PENDING and pending.total_tokens == 110
        call = pending.pending.calls[0]
        answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="ok")])
        resumed = (await stub.Resume(pb.ResumeRequest(runtime_id="rt", answer=answer))).result
        again = (await stub.Resume(pb.ResumeRequest(runtime_id="rt", answer=answer))).result
        assert resumed == again
        assert (resumed.turns, resumed.own_tokens, resumed.total_tokens) == (2, 200, 220)
        assert sum(model.calls.values()) == 4
        assert await counters(served.running.metrics_port) == (4, 220)
        assert ledger(store) == 220
        await check_tree(stub, "rt")
    # And after a restart: nothing of it is billed again.
    async with serve(**settings(model, store)) as served:
        assert (await wait(served.stub, "rt", root)).total_tokens == 220
        assert await counters(served.running.metrics_port) == (0, 0)
        assert ledger(store) == 220


# ---- delegation with judges and summarizers ----------------------------------------------


async def test_judges_and_summarizers_bill_to_the_tree_and_the_ledger(tmp_path: Path, model: ScriptedModelServer) -> None:
    calls = {"writer": 0}

    def writer(body: dict[str, Any]) -> Reply:
        # Counted here, not from the transcript: compaction takes the earlier turns out of it.
        done = calls["writer"]
        calls["writer"] += 1
        if done < 3:
            return Reply(calls=[("task", {"agent": "helper", "prompt": f"part {done}" + "x" * 400})], tokens=30)
        return Reply(text="final answer " + "y" * 50, tokens=30)

    verdicts = iter(["FAIL: too short", "PASS"])
    model.script("writer", writer)
    model.script("helper", lambda body: Reply(text="part done " + "z" * 400, tokens=7))
    model.script("judge", lambda body: Reply(text=next(verdicts, "PASS"), tokens=5))
    model.script("summarizer", lambda body: Reply(text="summary", tokens=3))
    store = tmp_path / "store.db"
    writer_def = agent(
        "writer",
        team=["helper"],
        completion=pb.CompletionGate(judge_agent="judge", max_attempts=3),
        compaction=pb.Compaction(max_context_tokens=300, keep_last_turns=1, summarizer_agent="summarizer"),
    )
    async with serve(**settings(model, store)) as served:
        stub = served.stub
        await create(stub, writer_def, agent("helper"), agent("judge"), agent("summarizer"), runtime_id="rt")
        _, first = await run(stub, "rt", "writer", "write")
        _, second = await run(stub, "rt", "helper", "alone")
        assert first.status == pb.STATUS_DONE, first
        listed = await check_tree(stub, "rt")
        assert {view.agent for view in listed.values()} >= {"writer", "helper", "judge", "summarizer"}
        spent = sum(view.own_tokens for view in listed.values())
        assert first.total_tokens + second.total_tokens == spent
        turns, tokens = await counters(served.running.metrics_port)
        assert (turns, tokens) == (sum(view.turns for view in listed.values()), spent)
        assert turns == sum(model.calls.values())
        assert ledger(store) == spent


# ---- estimated usage; a provider error past its retries -------------------------------------


async def test_estimated_usage_is_billed_as_reported_and_a_failed_call_not_at_all(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    bare = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "no usage here"}, "finish_reason": "stop"}]}'
    model.script("bare", lambda body: Reply(raw=bare))
    model.script("down", lambda body: Reply(status=503, raw='{"error": {"message": "busy"}}', headers={"Retry-After": "0"}))
    store = tmp_path / "store.db"
    async with serve(**settings(model, store, llm_max_retries=2)) as served:
        stub = served.stub
        await create(stub, agent("bare"), agent("down"), runtime_id="rt")
        _, estimated = await run(stub, "rt", "bare", "hello")
        assert estimated.status == pb.STATUS_DONE and estimated.own_tokens > 0
        [end] = await turn_ends(stub, "rt")
        assert end.turn_ended.usage_estimated and end.turn_ended.tokens == estimated.own_tokens
        # Split as input (the request) and output (the reply), marked estimated, the total as before.
        split = estimated.own_usage
        assert split.estimated and end.turn_ended.usage.estimated and estimated.total_usage.estimated
        assert (split.input_tokens > 0, split.cache_read_tokens, split.cache_write_tokens, split.reasoning_tokens) == (
            True,
            0,
            0,
            0,
        )
        assert split.input_tokens + split.output_tokens == split.total_tokens == estimated.own_tokens
        _, failed = await run(stub, "rt", "down", "hello")
        assert failed.status == pb.STATUS_ERROR and model.calls["down"] == 3
        assert (failed.turns, failed.own_tokens, failed.total_tokens) == (0, 0, 0)
        assert await counters(served.running.metrics_port) == (1, estimated.own_tokens)
        assert ledger(store) == estimated.own_tokens
        await check_tree(stub, "rt")


# ---- a SIGKILL with a turn in flight ----------------------------------------------------


async def test_a_turn_bought_again_after_a_sigkill_is_billed_once_everywhere(tmp_path: Path, model: ScriptedModelServer) -> None:
    slow = {"first": True}

    def lead(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("ask", {"question": "which?"})], tokens=100)
        delay = 5.0 if slow["first"] else 0.0
        slow["first"] = False
        return Reply(text="done", tokens=100, delay=delay)

    model.script("lead", lead)
    store = tmp_path / "store.db"
    port = free_port()
    env = {"AGENTRUNTIME_QUOTA_TOKENS_PER_DAY": str(QUOTA), "AGENTRUNTIME_METRICS_LISTEN": f"127.0.0.1:{port}"}
    server = ServerProcess(store, model.base_url, tmp_path / "server.log", env)
    stub = await server.start()
    try:
        await create(stub, agent("lead"), runtime_id="rt")
        root, pending = await run(stub, "rt", "lead", "go")
        assert pending.status == pb.STATUS_PENDING
        answer = pb.Answer(id=pending.pending.id, ok=True, data=struct({"answer": "that one"}))
        resuming = asyncio.ensure_future(stub.Resume(pb.ResumeRequest(runtime_id="rt", answer=answer), timeout=30))
        await until(lambda: model.calls["lead"] == 2, "the resumed turn's model call")
        server.send(signal.SIGKILL)
        await server.stop()
        resuming.cancel()
        stub = await server.restart()
        result = await wait(stub, "rt", root)
        assert model.calls["lead"] == 3  # the turn in flight at the kill was bought again
        assert (result.status, result.turns, result.own_tokens) == (pb.STATUS_DONE, 2, 200)
        assert ledger(store) == 200
        assert await counters(port) == (1, 100)
        await check_tree(stub, "rt")
    finally:
        await server.stop()


# ---- the tenant's ledger read again after a restart, on PostgreSQL ----------------------------


async def test_handles_recovered_together_all_see_the_token_quota_spent_before_the_restart(
    database: str, model: ScriptedModelServer
) -> None:
    """Two handles go on together after a restart: the first to ask reads the tenant's
    ledger from the database (an await); the second must wait for that read, not take the
    ledger as empty meanwhile and buy a turn past a quota used up before the restart."""
    model.script("slow", lambda body: Reply(text="late", tokens=60, delay=30.0 if model.calls["slow"] <= 2 else 0.0))
    model.script("spender", lambda body: Reply(text="spent", tokens=300))
    base: dict[str, Any] = {"llm_style": "openai", "llm_base_url": model.base_url, "llm_api_key": KEY, "store": database}
    # Room for the reservations of the three turns at once (their inputs' estimates), which the
    # spender's reply then uses up.
    async with serve(**base, quota_tokens_per_day=300) as first:
        await create(first.stub, agent("slow"), agent("spender"), runtime_id="rt")
        waiting = [await spawn(first.stub, "rt", "slow") for _ in range(2)]
        for handle in waiting:
            await first.stub.Wake(pb.WakeRequest(runtime_id="rt", handle_id=handle, prompt="go"))
        await until(lambda: model.calls["slow"] == 2, "both slow turns under way")
        _, spent = await run(first.stub, "rt", "spender", "spend it all")
        assert spent.total_tokens == 300  # the quota is used up
        await first.stop(grace=0.0)  # the slow turns are cut: their handles go on at the next start
    async with serve(**base, quota_tokens_per_day=300) as second:
        for handle in waiting:
            result = await wait(second.stub, "rt", handle)
            assert (result.status, result.limit, result.turns) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TOKENS, 0), result
        assert model.calls["slow"] == 2  # no turn bought past the quota


# ---- the ledger keeps the last day only -------------------------------------------------------


async def test_token_counts_older_than_a_day_go_at_a_turn_and_the_days_still_count(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    """A model turn under a token quota deletes the ledger's rows older than a day, every
    tenant's; the day's rows stay, and a restarted server counts them against the quota."""
    model.script("spender", lambda body: Reply(text="spent", tokens=50))
    store = tmp_path / "store.db"
    now = int(time.time() // 60)
    day_old, in_the_day = now - DAY_MINUTES - 10, now - DAY_MINUTES + 10  # ten minutes either side of a day
    async with serve(**settings(model, store, quota_tokens_per_day=100)) as first:
        with contextlib.closing(sqlite3.connect(store)) as db, db:
            db.executemany(
                "INSERT INTO tenant_tokens (tenant, minute, tokens) VALUES (?, ?, ?)",
                [("default", day_old, 1000), ("default", in_the_day, 50), ("globex", day_old, 1000), ("globex", now - 5, 7)],
            )
        await create(first.stub, agent("spender"), runtime_id="rt")
        _, result = await run(first.stub, "rt", "spender", "spend")
        assert (result.status, result.own_tokens) == (pb.STATUS_DONE, 50), result  # 50 of 100 spent in the day
        with contextlib.closing(sqlite3.connect(store)) as db:
            rows = db.execute("SELECT tenant, minute, tokens FROM tenant_tokens ORDER BY tenant, minute").fetchall()
        assert [row for row in rows if row[1] < now] == [("default", in_the_day, 50), ("globex", now - 5, 7)], rows
        assert ledger(store) == 100
    async with serve(**settings(model, store, quota_tokens_per_day=100)) as second:
        _, result = await run(second.stub, "rt", "spender", "more")
        assert (result.status, result.limit, result.turns) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TOKENS, 0), result
    assert model.calls["spender"] == 1
