"""Timers on the fake clock: a heartbeat posts a coalesced tick and wakes an idle handle on its
period; periods missed (a long run, a process that was down) come due as one tick that counts
them, never as a burst; a closed handle's heartbeat stops; a refused delete stops no timer; a
Request that expires lapses on time, after a restart too. No test waits for real time."""

from __future__ import annotations

import re
from typing import Any

import pytest
from agentruntime_server.domain.errors import FailedPrecondition, NotFound
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import HandleState, Heartbeat, Status, ToolSuspension

from tests.domain.harness import agent, http_tool, reply
from tests.domain.kit_suspension import Stage, relay_tool, tool_messages

BEATER = "root/beater.1"
TICK = "Messages received:\n[from heartbeat] tick"
CATCH_UP = re.compile(r"^Messages received:\n\[from heartbeat, (\d+) times: the latest shown\] tick$")


def beater(*replies: Any, every: float = 60) -> Any:
    return agent("beater", *(replies or (reply("beat", tokens=1),)), heartbeat=Heartbeat(every=every, prompt="tick"))


def runs_on(stage: Stage) -> list[str]:
    """The last user message of each of the beater's model calls: what woke each run."""
    return [next(m.content for m in reversed(r.messages) if m.role == "user") for r in stage.model.sent("beater")]


async def test_a_heartbeat_wakes_an_idle_handle_with_a_tick_once_a_period(stage: Stage) -> None:
    runtime = await stage.create(beater())
    await stage.spawn(runtime, "beater")
    await stage.clock.advance(59)
    assert runs_on(stage) == []  # never woken by the host: only the ticks wake it
    await stage.clock.advance(1)
    assert runs_on(stage) == [TICK]
    await stage.clock.advance(59)
    assert runs_on(stage) == [TICK]
    await stage.clock.advance(1)
    assert runs_on(stage) == [TICK, TICK]
    assert (await stage.settled(runtime, BEATER)).status is Status.DONE
    assert [m.content for m in runtime.transcript(BEATER) if m.role == "user"] == [TICK, TICK]


async def test_ticks_that_come_while_a_run_is_long_coalesce_into_one_counted_tick(stage: Stage) -> None:
    runtime = await stage.create(beater(reply("long", delay=250), reply("caught up")))
    await runtime.wake(await stage.spawn(runtime, "beater"), "work")
    await stage.clock.advance(250)  # ticks at 60, 120, 180 and 240 find it running
    assert runtime.inspect(BEATER).inbox_size == 1
    assert (await stage.settled(runtime, BEATER)).text == "long"
    await stage.clock.advance(50)  # the tick at 300 wakes it, with the four before it
    assert runs_on(stage) == ["work", "Messages received:\n[from heartbeat, 5 times: the latest shown] tick"]


async def test_a_suspended_handles_ticks_wait_in_its_inbox(stage: Stage) -> None:
    asker = agent(
        "beater", reply(calls=(("fetch", {}),)), tools=(relay_tool("fetch"),), heartbeat=Heartbeat(every=60, prompt="tick")
    )
    runtime = await stage.create(asker)
    await stage.run(runtime, "beater", "go")
    await stage.clock.advance(180)
    snapshot = runtime.inspect(BEATER)
    assert (snapshot.state, snapshot.inbox_size, stage.model.calls["beater"]) == (HandleState.SUSPENDED, 1, 1)


@pytest.mark.parametrize("ticked", [True, False], ids=["after a tick", "before its first tick"])
async def test_the_periods_missed_while_no_process_ran_come_due_at_the_restart_as_one_tick(stage: Stage, ticked: bool) -> None:
    runtime = await stage.create(beater(), runtime_id="beats")
    await stage.spawn(runtime, "beater")
    await stage.clock.advance(60 if ticked else 30)
    before = len(runs_on(stage))
    assert before == int(ticked)
    after = await stage.restarted(down=200)  # 200 s with no process: periods at 120, 180 and 240 (or 60 to 180) missed
    assert len(runs_on(stage)) == before + 1  # due at once at the restart, not a period after it
    catch_up = CATCH_UP.match(runs_on(stage)[-1])
    assert catch_up is not None and int(catch_up.group(1)) == 3
    await after.clock.advance(59)
    assert len(runs_on(stage)) == before + 1  # no burst: the next tick is a period later
    await after.clock.advance(1)
    assert runs_on(stage)[-1] == TICK
    restored = await after.service.runtime("beats")
    assert [m.content for m in restored.transcript(BEATER) if m.role == "user"] == runs_on(stage)


async def test_a_closed_handles_heartbeat_wakes_it_no_more(stage: Stage) -> None:
    runtime = await stage.create(beater())
    await stage.spawn(runtime, "beater")
    await stage.clock.advance(120)
    assert len(runs_on(stage)) == 2
    assert await runtime.close(BEATER, force=True) == [BEATER]
    await stage.clock.advance(600)
    assert (len(runs_on(stage)), runtime.inspect(BEATER).state) == (2, HandleState.CLOSED)
    assert stage.clock.pending == 0  # no timer left armed for it


async def test_a_refused_delete_changes_nothing_and_the_heartbeats_go_on(stage: Stage) -> None:
    runtime = await stage.create(beater(), agent("slow", reply("late", delay=500)), runtime_id="beats")
    await stage.spawn(runtime, "beater")
    await runtime.wake(await stage.spawn(runtime, "slow"), "take your time")
    await stage.clock.advance(60)
    assert runtime.inspect(BEATER).usage.turns == 1
    with pytest.raises(FailedPrecondition) as refused:
        await stage.service.delete_runtime("beats", force=False)
    assert refused.value.reason == "HANDLE_RUNNING"
    await stage.clock.advance(120)
    assert runtime.inspect(BEATER).usage.turns == 3  # the refused call released no timer
    assert runtime.inspect("root/slow.1").state is HandleState.RUNNING
    await stage.service.delete_runtime("beats", force=True)
    with pytest.raises(NotFound):
        await stage.service.runtime("beats")
    await stage.clock.advance(600)
    assert len(runs_on(stage)) == 3


# ---- a Request that expires, across a restart --------------------------------------------------


async def asks_to_sign_in(stage: Stage, expires_in: float) -> Runtime:
    expires = stage.clock.time() + expires_in
    stage.tools.bodies["login"] = lambda arguments: ToolSuspension(kind="authorization", prompt="sign in", expires_at=expires)
    runtime = await stage.create(
        agent("crm", reply(calls=(("login", {}),)), reply("went on"), tools=(http_tool("login"),)), runtime_id="crm"
    )
    assert (await stage.run(runtime, "crm", "log in")).status is Status.PENDING
    return runtime


async def test_a_request_that_expires_lapses_on_time_after_a_restart(stage: Stage) -> None:
    await asks_to_sign_in(stage, expires_in=60)
    after = await stage.restarted(down=30)
    await after.clock.advance(29)
    assert stage.model.calls["crm"] == 1
    await after.clock.advance(1)  # nobody called the runtime: its new process lapses it on its own
    runtime = await after.service.runtime("crm")
    done = await stage.settled(runtime, "root/crm.1")
    assert (done.status, done.text, stage.model.calls["crm"]) == (Status.DONE, "went on", 2)
    [(content, is_error)] = tool_messages(runtime, "root/crm.1")
    assert is_error and "expired" in content


async def test_a_request_whose_expiry_passed_while_no_process_ran_lapses_at_the_restart(stage: Stage) -> None:
    await asks_to_sign_in(stage, expires_in=60)
    after = await stage.restarted(down=600)
    runtime = await after.service.runtime("crm")
    assert runtime.inspect("root/crm.1").state is HandleState.IDLE
    assert (await stage.settled(runtime, "root/crm.1")).text == "went on"
    assert stage.tools.count("login") == 1
