"""What model calls cost (docs/usage.md#cost): each reply is priced when it comes, from the
AGENTRUNTIME_PRICES table in force then, rounded once, half up, to micro-units; the cost is
journaled with the reply, so a later price change and a restart's replay leave it as it was.
A bad price file stops the start with one line. What Budget.max_cost does (carved down the
tree, LIMIT_MAX_COST, or a `budget` Request with on_exhausted ASK) is the fast tier's:
tests/domain/test_budget_limits.py."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, create, run, wait
from tests.support.poll import until
from tests.support.servers import serve

PRICES = {"provider": "scripted", "model": "priced-*", "input": 2.5, "cache_read": 0.25, "cache_write": 3.125, "output": 10}
SPLIT = pb.Usage(input_tokens=1001, cache_read_tokens=3, cache_write_tokens=1, output_tokens=77, reasoning_tokens=20)
# 1001 x 2.5 + 3 x 0.25 + 1 x 3.125 + 77 x 10 = 3276.375 micros: 3276 (reasoning is inside output).
FIRST = 3276
# The same reply once output costs 20: 4046.375 micros: 4046.
SECOND = 4046


def write_prices(path: Path, **changes: Any) -> None:
    """Atomically, as the docs ask: another file renamed over it."""
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps({"currency": "USD", "prices": [{**PRICES, **changes}]}, indent=2))
    os.replace(staged, path)


def spender(name: str = "spender", model: str = "priced-a", budget: pb.Budget | None = None) -> pb.AgentDef:
    reply = pb.ScriptedReply(text="spent", usage=SPLIT)
    return agent(name, model=model, script=pb.Script(replies=[reply]), budget=budget)


async def test_a_reply_is_priced_when_it_comes_and_a_changed_price_applies_to_later_turns_only(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    write_prices(prices)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    async with serve(store=store, prices=str(prices)) as served:
        runtime_id = await create(served.stub, spender(), spender("free", model="unpriced"))
        handle_id, first = await run(served.stub, runtime_id, "spender", "one")
        assert (first.own_cost.micros, first.own_cost.currency, first.own_cost.priced) == (FIRST, "USD", True)
        assert first.own_usage.total_tokens == first.own_tokens == 1082 and first.own_usage.reasoning_tokens == 20

        write_prices(prices, output=20)
        watch = served.running.prices
        assert watch is not None
        await until(lambda: watch.current.prices[0].output == 20, "the server to read the new prices", timeout=10)
        await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="two"))
        second = await wait(served.stub, runtime_id, handle_id)
        assert second.own_cost.micros == FIRST + SECOND and second.total_cost == second.own_cost

        _, free = await run(served.stub, runtime_id, "free", "one")
        assert (free.own_cost.micros, free.own_cost.priced, free.own_tokens) == (0, False, 1082)

    # A restart replays the journal: each reply keeps the cost it had when it came.
    write_prices(prices, output=1000)
    async with serve(store=store, prices=str(prices)) as served:
        view = (await served.stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
        both = FIRST + SECOND
        assert (view.own_cost.micros, view.total_cost.micros, view.own_usage.output_tokens) == (both, both, 154)


async def test_a_bad_price_file_stops_the_start_with_one_line_naming_the_line(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    entry = '  {"provider": "scripted", "model": "*",\n   "input": 1, "cache_read": 1, "cache_write": 1, "output": -1}'
    prices.write_text('{"currency": "USD",\n "prices": [\n' + entry + "\n ]\n}\n")
    starting = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentruntime_server", "serve", "--listen", "127.0.0.1:0",
        env={**os.environ, "AGENTRUNTIME_PRICES": str(prices), "AGENTRUNTIME_STORE": "memory://",
             "AGENTRUNTIME_METRICS_LISTEN": "off"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(starting.communicate(), timeout=60)
    lines = (out + err).decode().strip().splitlines()
    assert starting.returncode == 2 and len(lines) == 1, (starting.returncode, lines)
    assert "AGENTRUNTIME_PRICES" in lines[0] and "line 3" in lines[0], lines[0]


async def test_a_tenants_cost_per_day_stops_its_runs_and_survives_a_restart(tmp_path: Path) -> None:
    """AGENTRUNTIME_QUOTA_COST_PER_DAY: before each model turn, the tenant's priced spend of the
    last 24 hours (kept per minute in the store, beside its tokens) must be under it."""
    prices = tmp_path / "prices.json"
    write_prices(prices)
    settings: dict[str, Any] = {
        "store": f"sqlite:///{tmp_path / 'store.db'}",
        "prices": str(prices),
        "quota_cost_per_day": FIRST + 1,
    }
    async with serve(**settings) as served:
        runtime_id = await create(served.stub, spender())
        _, first = await run(served.stub, runtime_id, "spender", "one")
        _, second = await run(served.stub, runtime_id, "spender", "two")  # 1 micro left: a turn may start
        assert (first.status, second.status) == (pb.STATUS_DONE, pb.STATUS_DONE)
        _, stopped = await run(served.stub, runtime_id, "spender", "three")
        assert (stopped.status, stopped.limit, stopped.turns) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_COST, 0)
        assert "cost quota" in stopped.text
    async with serve(**settings) as served:  # the day's spend is read back from the store
        _, again = await run(served.stub, runtime_id, "spender", "four")
        assert (again.status, again.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_COST)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("database"))
    return f"sqlite:///{tmp_path / 'store.db'}"


async def test_list_runtimes_shows_what_each_runtimes_handles_spent(tmp_path: Path, store_url: str) -> None:
    """A runtime's row sums its roots' totals (children included), kept in the store row, so a
    listing reads no journal; a restart lists the same."""
    prices = tmp_path / "prices.json"
    write_prices(prices)
    store = store_url
    async with serve(store=store, prices=str(prices)) as served:
        spending = await create(served.stub, spender(), spender("free", model="unpriced"))
        await run(served.stub, spending, "spender", "one")
        await run(served.stub, spending, "spender", "two")
        untouched = await create(served.stub, spender())
        listed = {row.runtime_id: row for row in (await served.stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes}
        assert (listed[spending].total_tokens, listed[spending].total_cost.micros) == (2 * 1082, 2 * FIRST)
        assert (listed[spending].total_cost.currency, listed[spending].total_cost.priced) == ("USD", True)
        assert (listed[untouched].total_tokens, listed[untouched].total_cost.micros) == (0, 0)
        await run(served.stub, spending, "free", "one")  # a call no price covers: the sum says so
        after = (await served.stub.ListRuntimes(pb.ListRuntimesRequest(page_size=1))).runtimes
        assert [row.runtime_id for row in after] == [untouched]  # newest first
        listed = {row.runtime_id: row for row in (await served.stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes}
        assert (listed[spending].total_tokens, listed[spending].total_cost.priced) == (3 * 1082, False)
    async with serve(store=store, prices=str(prices)) as served:
        again = {row.runtime_id: row for row in (await served.stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes}
        assert again[spending] == listed[spending]
