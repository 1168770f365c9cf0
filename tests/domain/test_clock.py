"""The Clock port (domain/clock.py) and the fake the fast tier moves by hand
(tests/support/clock.py): timers fire in order at their own time, a cancelled one never,
sleeps and deadlines end when the clock says; and the domain reads time through the port
alone, or the fast tier could not move it (the scan of its source names every line that
does otherwise)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from agentruntime_server.domain import clock as clock_port
from agentruntime_server.domain.clock import wait_at_most
from agentruntime_server.domain.vocabulary import HandleState, Status

from tests.domain.harness import Bench, agent, reply
from tests.domain.kit_clock import time_reads, time_reads_under
from tests.support.clock import START, FakeClock

DOMAIN = Path(clock_port.__file__).resolve().parent


# ---- the fake clock -------------------------------------------------------------------------


async def test_the_clocks_start_at_a_fixed_wall_time_and_move_only_when_advanced() -> None:
    clock = FakeClock()
    assert (clock.time(), clock.monotonic()) == (START, 0.0)
    await clock.settle()
    await asyncio.sleep(0)
    assert (clock.time(), clock.monotonic()) == (START, 0.0)  # the loop ran; time did not pass
    await clock.advance(2.5)
    await clock.advance(0.5)
    assert (clock.time(), clock.monotonic()) == (START + 3, 3.0)


async def test_timers_fire_in_the_order_they_are_due_each_at_its_own_time() -> None:
    clock = FakeClock()
    fired: list[tuple[str, float]] = []

    def firing(name: str) -> Callable[[], None]:
        return lambda: fired.append((name, clock.monotonic()))

    for name, delay in (("c", 30.0), ("a", 10.0), ("b", 20.0), ("a2", 10.0), ("now", 0.0)):
        clock.call_later(delay, firing(name))
    assert clock.pending == 5
    await clock.advance(15)
    # Due at the same time: in the order they were set. Each sees the clock at its due time.
    assert fired == [("now", 0.0), ("a", 10.0), ("a2", 10.0)]
    await clock.advance(15)
    assert fired[3:] == [("b", 20.0), ("c", 30.0)] and clock.pending == 0
    assert clock.monotonic() == 30.0


async def test_a_timer_set_by_a_timer_fires_within_the_same_advance_when_it_falls_due_in_it() -> None:
    clock = FakeClock()
    fired: list[float] = []

    def again() -> None:
        fired.append(clock.monotonic())
        if len(fired) < 10:
            clock.call_later(7, again)

    clock.call_later(7, again)
    await clock.advance(30)
    assert fired == [7.0, 14.0, 21.0, 28.0]  # the fifth is due at 35
    await clock.advance(5)
    assert fired[-1] == 35.0


async def test_a_cancelled_timer_never_fires_and_is_not_pending() -> None:
    clock = FakeClock()
    fired: list[str] = []
    kept = clock.call_later(5, lambda: fired.append("kept"))
    dropped = clock.call_later(5, lambda: fired.append("dropped"))
    later = clock.call_later(50, lambda: fired.append("later"))
    dropped.cancel()
    assert clock.pending == 2
    await clock.advance(10)
    later.cancel()
    await clock.advance(100)
    assert fired == ["kept"] and clock.pending == 0
    kept.cancel()  # cancelling a timer that fired already changes nothing
    assert fired == ["kept"]


async def test_a_sleep_ends_when_its_time_comes_and_not_before() -> None:
    clock = FakeClock()
    sleeping = asyncio.ensure_future(clock.sleep(10))
    await clock.advance(9.99)
    assert not sleeping.done()
    await clock.advance(0.01)
    assert sleeping.done() and clock.pending == 0
    # sleep(0) and a negative sleep only yield: no timer, no time.
    await clock.sleep(0)
    await clock.sleep(-3)
    assert (clock.pending, clock.monotonic()) == (0, 10.0)


async def test_a_cancelled_sleep_leaves_no_timer_behind() -> None:
    clock = FakeClock()
    sleeping = asyncio.ensure_future(clock.sleep(60))
    await clock.settle()
    assert clock.pending == 1
    sleeping.cancel()
    await asyncio.gather(sleeping, return_exceptions=True)
    assert clock.pending == 0


async def test_a_deadline_raises_timeout_in_its_block_when_the_clock_passes_it() -> None:
    clock = FakeClock()

    async def held_past(seconds: float) -> str:
        try:
            async with clock.deadline(seconds):
                await asyncio.Event().wait()  # never set: only the deadline ends it
        except TimeoutError:
            return f"timed out at {clock.monotonic()}"
        return "never"

    blocked = asyncio.ensure_future(held_past(30))
    await clock.advance(29)
    assert not blocked.done()
    await clock.advance(1)
    assert blocked.done() and blocked.result() == "timed out at 30.0"


async def test_a_block_done_in_time_is_not_cut_and_its_deadline_is_dropped() -> None:
    clock = FakeClock()

    async def within(seconds: float | None, takes: float) -> float:
        async with clock.deadline(seconds):
            await clock.sleep(takes)
        return float(clock.monotonic())

    done = asyncio.ensure_future(within(30, 10))
    await clock.advance(10)
    assert await done == 10.0 and clock.pending == 0  # the deadline's timer went with the block
    unbounded = asyncio.ensure_future(within(None, 1000))  # no deadline: only the sleep is armed
    await clock.settle()
    assert clock.pending == 1
    await clock.advance(1000)
    assert await unbounded == 1010.0


async def test_a_deadline_of_zero_is_due_at_once_as_a_real_one_is() -> None:
    clock = FakeClock()
    with pytest.raises(TimeoutError):
        async with clock.deadline(0):
            await asyncio.Event().wait()
    assert clock.monotonic() == 0.0
    # wait_at_most (a Close's grace, a shutdown's) gives a task that never ends no time at all.
    never = asyncio.ensure_future(asyncio.Event().wait())
    await wait_at_most(clock, [never], 0)
    assert not never.done()
    waiting = asyncio.ensure_future(wait_at_most(clock, [never], 5))
    await clock.advance(4)
    assert not waiting.done()
    await clock.advance(1)
    assert waiting.done() and not never.done()  # the grace ended; the task itself goes on
    never.cancel()


# ---- the domain reads time through the clock alone --------------------------------------------


def test_nothing_in_the_domain_reads_time_or_arms_a_timer_but_through_the_clock() -> None:
    found = time_reads_under(DOMAIN, DOMAIN / "clock.py")
    assert not found, "the domain reads time outside its Clock (Services.clock):\n" + "\n".join(map(str, found))
    assert len(list(DOMAIN.rglob("*.py"))) > 40  # the scan saw the domain, not an empty folder


@pytest.mark.parametrize(
    "line",
    [
        "now = time.time()",
        "began = time.monotonic()",
        "took = time.perf_counter() - began",
        "now = asyncio.get_running_loop().time()",
        "due = loop.time() + 5",
        "loop.call_later(5, beat)",
        "asyncio.get_running_loop().call_at(when, beat)",
        "await asyncio.sleep(1)",
        "await asyncio.sleep(delay)",
        "await asyncio.wait(tasks, timeout=grace)",
        "await asyncio.wait(tasks, 5)",
        "await asyncio.wait_for(task, 5)",
        "async with asyncio.timeout(seconds): pass",
        "stamp = datetime.datetime.now()",
        "day = date.today()",
        "import time",
        "from time import monotonic",
        "from asyncio import sleep",
    ],
)
def test_the_scan_names_each_way_of_reading_time_with_its_line(line: str) -> None:
    source = f"async def f(tasks, task, grace, delay, seconds, when, beat, loop):\n    pass\n    {line}\n"
    if line.startswith(("import", "from")):
        source = f"x = 1\n\n{line}\n"
    [found] = time_reads(source, "domain/example.py")
    assert found.line == 3 and found.code == line and str(found).startswith("domain/example.py:3: ")


@pytest.mark.parametrize(
    "line",
    [
        "now = self.services.clock.time()",
        "began = clock.monotonic()",
        "timer = host.services.clock.call_later(5, beat)",
        "await self.services.clock.sleep(5)",
        "async with self.services.clock.deadline(seconds): pass",
        "await asyncio.sleep(0)",
        "await asyncio.wait(tasks)",
        "await asyncio.wait(tasks, timeout=None)",
        "when = datetime.datetime.fromtimestamp(at, datetime.UTC)",
        "text = 'time.time() in a string'  # time.monotonic() in a comment",
    ],
)
def test_the_scan_lets_the_clock_and_what_reads_no_time_pass(line: str) -> None:
    source = f"async def f(self, host, clock, tasks, seconds, beat, at):\n    {line}\n"
    assert time_reads(source) == []


# ---- what the domain does with it: a Close's grace runs on the clock ------------------------


async def test_a_close_with_a_grace_waits_that_long_on_the_clock_then_stops_the_run(bench: Bench) -> None:
    runtime = await bench.create(agent("slow", reply("late", delay=60)))
    handle_id = await bench.spawn(runtime, "slow")
    await runtime.wake(handle_id, "go")
    closing = asyncio.ensure_future(runtime.close(handle_id, force=False, grace=10))
    await bench.clock.advance(9.9)
    assert not closing.done() and runtime.handle(handle_id).state is HandleState.RUNNING
    await bench.clock.advance(0.1)
    assert closing.done(), "the grace passed on the clock and the Close still waits"
    assert closing.result() == [handle_id]
    assert runtime.handle(handle_id).state is HandleState.CLOSED
    assert (await runtime.wait(handle_id, None)).status is Status.CLOSED


async def test_a_run_that_settles_within_the_grace_keeps_its_result(bench: Bench) -> None:
    runtime = await bench.create(agent("quick", reply("in time", delay=5)))
    handle_id = await bench.spawn(runtime, "quick")
    await runtime.wake(handle_id, "go")
    closing = asyncio.ensure_future(runtime.close(handle_id, force=False, grace=10))
    await bench.clock.advance(5)
    assert closing.done() and closing.result() == [handle_id]
    assert bench.clock.monotonic() == 5.0  # closed when the run settled, not at the grace's end
    result = await runtime.wait(handle_id, None)
    assert (result.status, result.text) == (Status.CLOSED, "in time")
