"""A tenant's quotas through the runtime service (domain/tenancy/), on the fast tier's bench:
its runtimes, its running handles (the rest QUEUED, in order, and the runs its own timers start
keep to them), the handles it creates in a rolling minute, the tokens and the cost it spends in
a rolling day (the ledger, in the store), its bytes in the store, its Watch and worker streams.
Each refusal is a QuotaExceeded naming the tenant and the quota, and changes nothing; another
tenant is never held by it. Time moves by the fake clock alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import pytest
from agentruntime_server.domain.billing.prices import Price, PriceTable
from agentruntime_server.domain.errors import ResourceExhausted
from agentruntime_server.domain.limits import Quotas
from agentruntime_server.domain.tenancy.quotas import StreamQuota
from agentruntime_server.domain.vocabulary import Budget, HandleState, Heartbeat, Limit, Status, ToolSuspension

from tests.domain.harness import agent, bench_with, http_tool, reply
from tests.domain.kit_tenancy import Trace, quota_refusal, restarted, written

DAY = 24 * 3600.0
SOLO = agent("solo", reply("done", tokens=5))
SLOW = agent("slow", reply("slow done", delay=10))


def tasks(*prompts: str, to: str = "w") -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple(("task", {"agent": to, "prompt": prompt}) for prompt in prompts)


# ---- runtimes -------------------------------------------------------------------------------


async def test_a_tenant_at_its_runtimes_quota_creates_none_more_until_it_deletes_one() -> None:
    bench = await bench_with(quotas=Quotas(runtimes=2))
    for runtime_id in ("one", "two"):
        await bench.create(SOLO, runtime_id=runtime_id, tenant="acme")
    for runtime_id in ("three", ""):  # a generated id too
        with pytest.raises(ResourceExhausted) as raised:
            await bench.service.create_runtime(runtime_id, (SOLO,), tenant="acme")
        assert "DeleteRuntime" in quota_refusal(raised.value, "acme", "runtimes")
    assert await bench.store.count_runtimes("acme") == 2 and sorted(bench.service.cache.runtimes) == ["acme:one", "acme:two"]
    await bench.create(SOLO, runtime_id="one", tenant="globex")  # a quota per tenant
    await bench.service.delete_runtime("one", force=False, tenant="acme")
    await bench.create(SOLO, runtime_id="three", tenant="acme")
    assert await bench.store.count_runtimes("acme") == 2


# ---- running handles ------------------------------------------------------------------------


async def test_a_wake_past_the_running_handles_quota_is_refused_and_changes_nothing() -> None:
    bench = await bench_with(quotas=Quotas(running_handles=2))
    runtime = await bench.create(SLOW, tenant="acme")
    other = await bench.create(SLOW, tenant="acme")  # the quota is the tenant's, over its runtimes
    first, second, third = [await bench.spawn(runtime, "slow") for _ in range(3)]
    await runtime.post(third, "a note", "", "host")
    for handle_id in (first, second):
        assert await runtime.wake(handle_id, "go")
    before = await written(bench, runtime)
    with pytest.raises(ResourceExhausted) as raised:
        await runtime.wake(third, "go")
    assert "Wait for some to settle" in quota_refusal(raised.value, "acme", "running_handles")
    elsewhere = await bench.spawn(other, "slow")
    with pytest.raises(ResourceExhausted) as raised:
        await other.wake(elsewhere, "go")
    quota_refusal(raised.value, "acme", "running_handles")
    assert await written(bench, runtime) == before
    assert (runtime.handle(third).state, len(runtime.handle(third).inbox)) == (HandleState.IDLE, 1)  # its note still waits

    globex = await bench.create(SLOW, tenant="globex")  # another tenant runs meanwhile
    assert await globex.wake(await bench.spawn(globex, "slow"), "go")
    await bench.clock.advance(10)
    assert await runtime.wake(third, "now")  # the first two settled: room again
    await bench.clock.advance(10)
    assert (await runtime.wait(third, None)).text == "slow done"


async def test_delegated_children_past_the_quota_queue_and_get_their_slots_in_order() -> None:
    trace = Trace()
    bench = await bench_with(quotas=Quotas(running_handles=2), observers=(trace,))
    lead = agent("lead", reply(calls=tasks("1", "2", "3", "4", "5")), reply("lead done"), team=("w",))
    runtime = await bench.create(lead, agent("w", reply("w done", delay=10)))
    root = await bench.spawn(runtime, "lead")
    await runtime.wake(root, "go")
    waiting = asyncio.ensure_future(runtime.wait(root, None))
    await bench.clock.advance(10)
    # The lead waits on its five children: two done, two running, one QUEUED.
    assert Counter(handle.state for handle in runtime.handles.values()) == {
        HandleState.IDLE: 2,
        HandleState.RUNNING: 3,
        HandleState.QUEUED: 1,
    }
    await bench.clock.advance(30)
    result = await waiting
    assert (result.status, result.text) == (Status.DONE, "lead done")
    children = [f"{root}/w.{n}" for n in range(1, 6)]
    assert [handle for handle in trace.turns_started() if handle != root] == children  # in the order they were called
    queued = trace.states(HandleState.QUEUED)
    assert queued and queued == [handle for handle in trace.states(HandleState.RUNNING) if handle in queued][-len(queued) :]
    assert trace.peak_turns() == 2  # never more at once than the quota, and the quota used
    assert bench.service.running_slots("default") == (0, 0)  # every slot given back


async def test_a_quota_of_one_runs_a_deep_tree_a_handle_at_a_time_without_deadlock() -> None:
    trace = Trace()
    bench = await bench_with(quotas=Quotas(running_handles=1), observers=(trace,))
    lead = agent("lead", reply(calls=tasks("a", "b", to="mid")), reply("lead done"), team=("mid",))
    mid = agent("mid", reply(calls=tasks("x", "y")), reply("mid done"), team=("w",))
    runtime = await bench.create(lead, mid, agent("w", reply("w done", delay=1)))
    root = await bench.spawn(runtime, "lead")
    await runtime.wake(root, "go")
    waiting = asyncio.ensure_future(runtime.wait(root, None))
    await bench.clock.advance(10)
    result = await waiting
    assert (result.status, result.text, len(runtime.handles)) == (Status.DONE, "lead done", 7)
    assert trace.peak_turns() == 1 and bench.service.running_slots("default") == (0, 0)


async def test_a_heartbeat_starts_no_run_past_the_tenants_running_handles_quota() -> None:
    """Moved from tests/api/test_quotas.py, where it slept 2.5 s for two beats."""
    bench = await bench_with(quotas=Quotas(running_handles=1))
    beating = agent("beating", reply("slow", delay=20), heartbeat=Heartbeat(every=1, prompt="tick"))
    runtime = await bench.create(beating, tenant="acme")
    spawned = [await bench.spawn(runtime, "beating") for _ in range(3)]
    await bench.clock.advance(2.5)  # two beats of every handle
    states = {handle_id: runtime.handle(handle_id).state for handle_id in spawned}
    assert list(states.values()).count(HandleState.RUNNING) == 1, states
    held = [handle_id for handle_id, state in states.items() if state is not HandleState.RUNNING]
    for handle_id in held:  # the ticks the quota held back wait in its inbox, coalesced
        assert [(item.sender, item.count) for item in runtime.handle(handle_id).inbox] == [("heartbeat", 2)]
    with pytest.raises(ResourceExhausted) as raised:  # woken as a Wake would be: refused
        await runtime.wake(held[0], "now")
    quota_refusal(raised.value, "acme", "running_handles")
    await bench.clock.advance(20)  # the running one settled at 21 s: a beat since started one run, no more
    states = {handle_id: runtime.handle(handle_id).state for handle_id in spawned}
    assert list(states.values()).count(HandleState.RUNNING) == 1, states
    assert sum(runtime.handle(handle_id).usage.turns for handle_id in spawned) == 1
    assert bench.service.running_slots("acme") == (1, 0)


async def test_an_expired_request_lapses_once_the_tenants_running_handles_quota_has_room() -> None:
    """Moved from tests/api/test_quotas.py, where it waited for a sign-in to expire in real time."""
    bench = await bench_with(quotas=Quotas(running_handles=1))
    bench.tools.bodies["crm_login"] = lambda arguments: ToolSuspension(
        kind="sign_in", prompt="sign in", url="https://crm.example/login", expires_at=bench.clock.time() + 1
    )
    crm = agent("crm", reply(calls=(("crm_login", {}),)), reply("crm done"), tools=(http_tool("crm_login"),))
    runtime = await bench.create(crm, agent("slow", reply("slow done", delay=4.5)))
    asked = await bench.run(runtime, "crm", "log in")
    assert asked.status is Status.PENDING and asked.pending is not None
    assert asked.pending.expires_at == bench.clock.time() + 1
    busy = await bench.spawn(runtime, "slow")
    await runtime.wake(busy, "take your time")  # the tenant's one running handle, when the Request expires
    crm_id = asked.handle_id
    await bench.clock.advance(4.9)  # expired at 1 s; held back by the quota, tried again each second
    assert (await runtime.wait(busy, None)).status is Status.DONE  # settled at 4.5 s
    assert runtime.handle(crm_id).state is HandleState.SUSPENDED and runtime.handle(crm_id).usage.turns == 1
    await bench.clock.advance(0.1)  # the next try finds room
    result = await runtime.wait(crm_id, None)
    assert (result.status, result.text, result.usage.turns) == (Status.DONE, "crm done", 2)
    [told] = [message for message in runtime.transcript(crm_id) if message.role == "tool"]
    assert told.is_error and "expired" in told.content, told


async def test_a_child_queued_past_its_wall_time_stops_at_it_and_gives_its_place_back() -> None:
    """Moved from tests/api/test_quotas.py, where its wall time and its sibling's turn passed in real time."""
    bench = await bench_with(quotas=Quotas(running_handles=1))
    lead = agent(
        "lead",
        reply(calls=(("task", {"agent": "slow", "prompt": "x"}), ("task", {"agent": "hasty", "prompt": "y"}))),
        reply("lead done"),
        team=("hasty", "slow"),
    )
    hasty = agent("hasty", reply("hasty done"), budget=Budget(max_wall_time=3))
    runtime = await bench.create(lead, SLOW, hasty)
    root = await bench.spawn(runtime, "lead")
    await runtime.wake(root, "go")
    waiting = asyncio.ensure_future(runtime.wait(root, None))
    await bench.clock.advance(3)
    [hasty_id] = [handle.id for handle in runtime.handles.values() if handle.agent.name == "hasty"]
    settled = runtime.handle(hasty_id)
    assert (settled.state, settled.usage.turns) == (HandleState.IDLE, 0)  # stopped while queued, never ran
    assert bench.service.running_slots("default") == (1, 0)  # its place given back: only the slow one holds a slot
    await bench.clock.advance(7)
    result = await waiting
    assert (result.status, result.text) == (Status.DONE, "lead done")
    told = [message.content for message in runtime.transcript(root) if message.role == "tool"]
    assert any("MAX_WALL_TIME" in text for text in told), told
    assert bench.service.running_slots("default") == (0, 0)


# ---- handles per minute ---------------------------------------------------------------------


async def test_the_handles_per_minute_quota_rolls_with_the_clock_per_tenant() -> None:
    bench = await bench_with(quotas=Quotas(handles_per_minute=3))
    runtime = await bench.create(SOLO, tenant="acme")
    other = await bench.create(SOLO, tenant="acme")
    await bench.spawn(runtime, "solo")
    await bench.clock.advance(30)
    for _ in range(2):
        await bench.spawn(runtime, "solo")
    before = await written(bench, runtime)
    for refused_in in (runtime, other):  # the tenant's, over its runtimes
        with pytest.raises(ResourceExhausted) as raised:
            await bench.spawn(refused_in, "solo")
        assert "spawn again later" in quota_refusal(raised.value, "acme", "handles_per_minute")
    assert (len(runtime.handles), len(other.handles), await written(bench, runtime)) == (3, 0, before)
    globex = await bench.create(SOLO, tenant="globex")
    assert [await bench.spawn(globex, "solo") for _ in range(3)][-1] == "root/solo.3"

    await bench.clock.advance(29.9)
    with pytest.raises(ResourceExhausted):
        await bench.spawn(other, "solo")
    await bench.clock.advance(0.1)  # a minute after the first: it left the window, the two of 30 s did not
    assert await bench.spawn(other, "solo") == "root/solo.1"
    with pytest.raises(ResourceExhausted):
        await bench.spawn(other, "solo")
    await bench.clock.advance(30)
    assert [await bench.spawn(other, "solo") for _ in range(2)] == ["root/solo.2", "root/solo.3"]
    with pytest.raises(ResourceExhausted):
        await bench.spawn(runtime, "solo")


async def test_a_spawn_refused_for_another_reason_is_not_counted_in_the_minute() -> None:
    bench = await bench_with(quotas=Quotas(handles_per_minute=2))
    runtime = await bench.create(agent("lead", team=("w",)), agent("w"))
    lead = await bench.spawn(runtime, "lead", budget=Budget(max_children=0))
    for _ in range(3):
        with pytest.raises(ResourceExhausted) as raised:
            await bench.spawn(runtime, "w", parent=lead)
        assert raised.value.limit is Limit.MAX_CHILDREN
    assert await bench.spawn(runtime, "w")  # one of two: the refused spawns took none
    with pytest.raises(ResourceExhausted) as raised:
        await bench.spawn(runtime, "w")
    quota_refusal(raised.value, "default", "handles_per_minute")


async def test_a_delegation_past_the_handles_per_minute_quota_is_an_error_result_for_the_model() -> None:
    bench = await bench_with(quotas=Quotas(handles_per_minute=3))
    lead = agent("lead", reply(calls=tasks("0", "1", "2")), reply("lead done"), team=("w",))
    runtime = await bench.create(lead, agent("w", reply("w done")))
    result = await bench.run(runtime, "lead", "go")  # 1 of 3: two children fit, the third does not
    assert (result.status, result.text, len(runtime.handles)) == (Status.DONE, "lead done", 3)
    told = [(message.content, message.is_error) for message in runtime.transcript(result.handle_id) if message.role == "tool"]
    assert sorted(is_error for _, is_error in told) == [False, False, True], told
    refusal = next(text for text, is_error in told if is_error)
    assert "not spawned" in refusal and "QUOTA_EXCEEDED" in refusal and "AGENTRUNTIME_QUOTA_HANDLES_PER_MINUTE" in refusal


# ---- tokens and cost per day ----------------------------------------------------------------


async def test_the_tokens_per_day_quota_stops_the_turn_it_cannot_start_until_the_day_rolls_on() -> None:
    bench = await bench_with(quotas=Quotas(tokens_per_day=100))
    spender = agent("spender", reply("spent", tokens=60))
    runtime = await bench.create(spender, tenant="acme")
    assert [(await bench.run(runtime, "spender", "go")).status for _ in range(2)] == [Status.DONE] * 2  # 40 left at the second
    stopped = await bench.run(runtime, "spender", "again")
    assert (stopped.status, stopped.limit, stopped.usage.turns) == (Status.INCOMPLETE, Limit.MAX_TOKENS, 0)
    assert "token quota for the last 24 hours is used up" in stopped.text
    globex = await bench.create(spender, tenant="globex")
    assert (await bench.run(globex, "spender", "go")).status is Status.DONE  # another tenant's day is its own

    await bench.clock.advance(DAY - 60)  # the spends' minute is still within the day
    assert (await bench.run(runtime, "spender", "again")).limit is Limit.MAX_TOKENS
    await bench.clock.advance(60)
    done = await bench.run(runtime, "spender", "a day later")
    assert (done.status, done.usage.turns) == (Status.DONE, 1)


async def test_a_run_stops_at_the_first_turn_its_tenants_day_cannot_start() -> None:
    bench = await bench_with(quotas=Quotas(tokens_per_day=100))
    looper = agent("looper", reply(calls=(("ping", {}),), tokens=40), tools=(http_tool("ping"),))
    runtime = await bench.create(looper)
    result = await bench.run(runtime, "looper", "go")
    # 40 and 80 leave room for a third turn; 120 none for a fourth.
    assert (result.status, result.limit, result.usage.turns, result.usage.own_tokens) == (
        Status.INCOMPLETE,
        Limit.MAX_TOKENS,
        3,
        120,
    )


async def test_the_days_spend_is_kept_in_the_store_and_a_restarted_process_counts_it() -> None:
    bench = await bench_with(quotas=Quotas(tokens_per_day=100))
    runtime = await bench.create(agent("spender", reply("spent", tokens=100)), runtime_id="rt", tenant="acme")
    await bench.run(runtime, "spender", "go")
    minute = int(bench.clock.time() // 60)
    assert await bench.store.tokens_since("acme", minute - 5) == [(minute, 100, 0)]
    await bench.clock.advance(600)
    again = restarted(bench)
    loaded = await again.service.runtime("rt", "acme")
    stopped = await again.run(loaded, "spender", "after the restart")
    assert (stopped.status, stopped.limit) == (Status.INCOMPLETE, Limit.MAX_TOKENS)
    await bench.clock.advance(DAY)
    assert (await again.run(loaded, "spender", "a day later")).status is Status.DONE


async def test_the_ledgers_rows_older_than_a_day_leave_the_store_at_a_turn_and_the_days_stay() -> None:
    """Every tenant's, at most once a minute, a minute past the day a quota reads (a replica
    whose clock is a minute behind still finds its day)."""
    bench = await bench_with(quotas=Quotas(tokens_per_day=1000))
    spender = agent("spender", reply("spent", tokens=10))
    acme, globex = await bench.create(spender, tenant="acme"), await bench.create(spender, tenant="globex")
    first = int(bench.clock.time() // 60)
    await bench.run(acme, "spender", "go")
    await bench.run(globex, "spender", "go")
    await bench.clock.advance(3600)
    await bench.run(globex, "spender", "an hour on")
    await bench.clock.advance(DAY - 3600 + 60)  # a day and a minute after the first spends
    await bench.run(acme, "spender", "a day on")
    now = int(bench.clock.time() // 60)
    assert now == first + 24 * 60 + 1
    assert await bench.store.tokens_since("acme", 0) == [(first, 10, 0), (now, 10, 0)]  # a minute past the day: kept
    await bench.clock.advance(60)
    await bench.run(acme, "spender", "a minute more")
    assert await bench.store.tokens_since("acme", 0) == [(now, 10, 0), (now + 1, 10, 0)]
    assert await bench.store.tokens_since("globex", 0) == [(first + 60, 10, 0)]  # another tenant's old row went too


async def test_the_cost_per_day_quota_counts_priced_replies_in_a_rolling_day() -> None:
    two_micros_a_token = PriceTable("USD", (Price("scripted", "scripted", Decimal(0), Decimal(0), Decimal(0), Decimal(2)),))
    bench = await bench_with(quotas=Quotas(cost_per_day=200), prices=two_micros_a_token)
    runtime = await bench.create(agent("spender", reply("spent", tokens=60)), tenant="acme")
    first = await bench.run(runtime, "spender", "go")
    assert first.usage.own_cost.micros == 120
    assert (await bench.run(runtime, "spender", "again")).status is Status.DONE  # 80 micros left at its start
    stopped = await bench.run(runtime, "spender", "once more")
    assert (stopped.status, stopped.limit, stopped.usage.turns) == (Status.INCOMPLETE, Limit.MAX_COST, 0)
    assert "cost quota for the last 24 hours is used up" in stopped.text
    minute = int(bench.clock.time() // 60)
    assert await bench.store.tokens_since("acme", minute) == [(minute, 120, 240)]  # the ledger: tokens and micros
    await bench.clock.advance(DAY)
    assert (await bench.run(runtime, "spender", "a day later")).status is Status.DONE


# ---- bytes in the store -----------------------------------------------------------------------


async def test_a_tenant_past_its_store_bytes_grows_nothing_until_a_delete_frees_room() -> None:
    bench = await bench_with(quotas=Quotas(store_bytes=20_000))
    asked_before: list[bool] = []

    def lookup(arguments: dict[str, Any]) -> str | ToolSuspension:
        """Asks its host the first time; called again with the answer, answers."""
        if asked_before:
            return "42"
        asked_before.append(True)
        return ToolSuspension(kind="input", prompt="what is it?")

    bench.tools.bodies["lookup"] = lookup
    asker = agent("asker", reply(calls=(("lookup", {}),)), reply("answered"), tools=(http_tool("lookup"),))
    small = await bench.create(SOLO, asker, runtime_id="small", tenant="acme")
    handle_id = await bench.spawn(small, "solo")
    await small.post(handle_id, "before", "", "host")
    asked = await bench.run(small, "asker", "look it up")
    assert asked.status is Status.PENDING
    # Under the quota when it came: created. Past it now: nothing that grows the store goes.
    await bench.create(agent("big", reply("hi"), instructions="x" * 30_000), runtime_id="big", tenant="acme")
    before = await written(bench, small)
    refusals: list[Callable[[], Awaitable[object]]] = [
        lambda: bench.service.create_runtime("more", (SOLO,), tenant="acme"),
        lambda: small.spawn("root", "solo", None),
        lambda: small.post(handle_id, "after", "", "host"),
        lambda: small.wake(handle_id, "go"),
        lambda: bench.resume(small, asked),
    ]
    for call in refusals:
        with pytest.raises(ResourceExhausted) as raised:
            await call()
        assert "DeleteRuntime" in quota_refusal(raised.value, "acme", "store_bytes")
    assert await written(bench, small) == before and not await bench.store.runtime_exists("acme:more")
    assert (len(small.handle(handle_id).inbox), small.handle(asked.handle_id).state) == (1, HandleState.SUSPENDED)
    assert small.inspect(handle_id).inbox_size == 1  # reads go on
    globex = await bench.create(SOLO, runtime_id="small", tenant="globex")
    assert (await bench.run(globex, "solo", "go")).status is Status.DONE

    await bench.service.delete_runtime("big", force=False, tenant="acme")  # frees the room at once
    assert await small.wake(handle_id, "go")
    assert (await small.wait(handle_id, None)).status is Status.DONE
    assert (await bench.resume(small, asked)).text == "answered"


# ---- Watch and worker streams ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["watch_streams", "worker_streams"])
async def test_a_tenants_open_streams_are_bounded_and_a_closed_one_frees_its_place(kind: StreamQuota) -> None:
    other: StreamQuota = "worker_streams" if kind == "watch_streams" else "watch_streams"
    bench = await bench_with(quotas=Quotas(**{kind: 2, other: 1}))
    service = bench.service
    with contextlib.ExitStack() as held:
        first = held.enter_context(contextlib.ExitStack())
        first.enter_context(service.open_stream(kind, "acme"))
        held.enter_context(service.open_stream(kind, "acme"))
        with pytest.raises(ResourceExhausted) as raised:
            held.enter_context(service.open_stream(kind, "acme"))
        assert "close one first" in quota_refusal(raised.value, "acme", kind)
        assert service.tenancy.streams(kind, "acme") == 2  # the refused one took no place
        held.enter_context(service.open_stream(kind, "globex"))  # another tenant's are its own
        held.enter_context(service.open_stream(other, "acme"))  # and so are the other kind's
        first.close()  # a stream that ends gives its place back
        assert service.tenancy.streams(kind, "acme") == 1
        held.enter_context(service.open_stream(kind, "acme"))
    assert (service.tenancy.streams(kind, "acme"), service.tenancy.streams(kind, "globex")) == (0, 0)
    with contextlib.suppress(ConnectionResetError), service.open_stream(kind, "acme"):
        raise ConnectionResetError  # a stream that fails gives it back too
    assert service.tenancy.streams(kind, "acme") == 0


# ---- a tenant's own quotas ------------------------------------------------------------------


async def test_a_tenants_own_quotas_stand_over_the_servers_and_zero_is_none() -> None:
    own = {"acme": {"handles_per_minute": 1}, "initech": {"handles_per_minute": 0}}
    bench = restarted(await bench_with(quotas=Quotas(handles_per_minute=3)), quotas_for=own.get)
    spawned: dict[str, int] = {}
    for tenant in ("acme", "globex", "initech"):
        runtime = await bench.create(SOLO, tenant=tenant)
        spawned[tenant] = 0
        with contextlib.suppress(ResourceExhausted):
            for _ in range(10):
                await bench.spawn(runtime, "solo")
                spawned[tenant] += 1
    assert spawned == {"acme": 1, "globex": 3, "initech": 10}  # its own, the server's, none
