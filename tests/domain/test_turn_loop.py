"""The turn loop through the runtime service, in-process (tests/domain/harness.py): answers,
tool calls and their results, limits that stop a run loudly, time that a test moves by hand."""

from __future__ import annotations

import asyncio

from agentruntime_server.domain.vocabulary import Budget, Heartbeat, Limit, Status

from tests.domain.harness import Bench, agent, http_tool, reply


async def test_an_answer_settles_done_with_its_figures(bench: Bench) -> None:
    runtime = await bench.create(agent("solo", reply("done", tokens=7)))
    result = await bench.run(runtime, "solo", "go")
    assert (result.status, result.text, result.usage.turns, result.usage.own_tokens) == (Status.DONE, "done", 1, 7)


async def test_tool_calls_run_and_their_results_reach_the_next_turn(bench: Bench) -> None:
    bench.tools.bodies["lookup"] = lambda arguments: f"found {arguments['q']}"
    worker = agent(
        "worker", reply(calls=(("lookup", {"q": "a"}), ("lookup", {"q": "b"}))), reply("both found"), tools=(http_tool("lookup"),)
    )
    runtime = await bench.create(worker)
    result = await bench.run(runtime, "worker", "look")
    assert (result.status, result.text, result.usage.turns, result.usage.tool_calls) == (Status.DONE, "both found", 2, 2)
    assert [arguments["q"] for _, arguments, _ in bench.tools.calls] == ["a", "b"]
    tool_messages = [message.content for message in runtime.transcript(result.handle_id) if message.role == "tool"]
    assert tool_messages == ["found a", "found b"]


async def test_max_turns_stops_the_run_incomplete_with_its_limit(bench: Bench) -> None:
    looping = agent("looper", reply(calls=(("ping", {}),)), tools=(http_tool("ping"),))
    runtime = await bench.create(looping)
    result = await bench.run(runtime, "looper", "go", budget=Budget(max_turns=3))
    assert (result.status, result.limit, result.usage.turns) == (Status.INCOMPLETE, Limit.MAX_TURNS, 3)


async def test_a_wait_with_a_timeout_returns_timeout_when_the_clock_passes_it(bench: Bench) -> None:
    runtime = await bench.create(agent("slow", reply("late", delay=30)))
    handle_id = await bench.spawn(runtime, "slow")
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, 10))
    await bench.clock.advance(9)
    assert not waiting.done()
    await bench.clock.advance(1)
    assert (await waiting).status is Status.TIMEOUT
    await bench.clock.advance(20)
    assert (await runtime.wait(handle_id, None)).text == "late"


async def test_max_wall_time_stops_a_run_when_the_clock_passes_it(bench: Bench) -> None:
    runtime = await bench.create(agent("slow", reply("late", delay=60)))
    handle_id = await bench.spawn(runtime, "slow", budget=Budget(max_wall_time=5))
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await bench.clock.advance(5)
    result = await waiting
    assert (result.status, result.limit) == (Status.INCOMPLETE, Limit.MAX_WALL_TIME)


async def test_a_heartbeat_wakes_an_idle_handle_on_its_period(bench: Bench) -> None:
    beating = agent("beat", reply("tick seen"), heartbeat=Heartbeat(every=60, prompt="tick"))
    runtime = await bench.create(beating)
    handle_id = await bench.spawn(runtime, "beat")
    await bench.clock.advance(59)
    assert runtime.handle(handle_id).usage.turns == 0
    await bench.clock.advance(1)
    assert runtime.handle(handle_id).usage.turns == 1
    await bench.clock.advance(120)
    assert runtime.handle(handle_id).usage.turns == 3
