"""Delegation in the domain: the task tool runs a child on a fresh transcript and gives its
parent one tool message; parallel task calls run at once; a child's suspension travels to the
root and a Resume continues the child, then the parent; a re-entered task call reattaches to
its child; the team is advertised sorted; a failed child is an error result for its parent.
Model calls and tool calls are counted, so nothing is shown to run twice."""

from __future__ import annotations

import asyncio

import pytest
from agentruntime_server.domain.errors import FailedPrecondition
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import (
    Budget,
    CompletionGate,
    HandleState,
    Limit,
    ReplyStop,
    ScriptedReply,
    Status,
    TaskResult,
)

from tests.domain.harness import agent, http_tool, reply
from tests.domain.kit_suspension import (
    LEAD,
    Stage,
    coordinator,
    outputs_for,
    pending_of,
    relay_tool,
    task,
    tool_messages,
    worker_suspending_on,
)


async def delegated(stage: Stage, *prompts: str, suspending: tuple[str, ...] = ()) -> tuple[Runtime, TaskResult]:
    runtime = await stage.create(coordinator(*prompts), worker_suspending_on(stage, *suspending))
    return runtime, await stage.run(runtime, "coordinator", "go")


# ---- the task tool ------------------------------------------------------------------------------


async def test_a_task_call_runs_a_child_on_a_fresh_transcript_and_gives_its_parent_one_tool_message(stage: Stage) -> None:
    lead = agent(
        "coordinator",
        reply(calls=(task("look around", "explore"),), tokens=100),
        reply("coordinated", tokens=100),
        team=("explore",),
    )
    runtime = await stage.create(lead, agent("explore", reply("found it", tokens=400)))
    result = await stage.run(runtime, "coordinator", "map the repo")
    usage = result.usage
    assert (result.status, result.text, usage.turns, usage.own_tokens, usage.total_tokens, usage.tool_calls) == (
        Status.DONE,
        "coordinated",
        2,
        200,
        600,
        1,
    )
    child = runtime.inspect(f"{LEAD}/explore.1")
    assert (child.parent_id, child.state, child.usage.own_tokens, child.usage.total_tokens) == (LEAD, HandleState.IDLE, 400, 400)
    # The child saw its prompt alone: nothing of its parent's conversation.
    [sent] = stage.model.sent("explore")
    assert [(m.role, m.content) for m in sent.messages] == [("user", "look around")]
    assert [(m.role, m.content) for m in runtime.transcript(f"{LEAD}/explore.1")] == [
        ("user", "look around"),
        ("assistant", "found it"),
    ]
    assert tool_messages(runtime, LEAD) == [("found it", False)]


async def test_the_task_tool_advertises_only_the_team_sorted_by_name(stage: Stage) -> None:
    runtime = await stage.create(
        agent("lead", reply("ok"), team=("zeta", "alpha")),
        agent("zeta", reply("z")),
        agent("alpha", reply("a")),
        agent("outsider", reply("o")),
    )
    await stage.run(runtime, "lead", "go")
    [sent] = stage.model.sent("lead")
    [tool] = [tool for tool in sent.tools if tool.name == "task"]
    assert tool.parameters["properties"]["agent"]["enum"] == ["alpha", "zeta"]
    assert tool.description.index("- alpha:") < tool.description.index("- zeta:")
    assert "outsider" not in tool.description


async def test_parallel_task_calls_in_one_turn_run_at_once(stage: Stage) -> None:
    fan = agent(
        "fan", reply(calls=tuple(task(str(n)) for n in range(3)), tokens=10), reply("merged", tokens=10), team=("worker",)
    )
    runtime = await stage.create(fan, agent("worker", reply("w", tokens=5, delay=30)))
    handle_id = await stage.spawn(runtime, "fan")
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await stage.clock.advance(29)
    assert (stage.model.in_flight, waiting.done()) == (3, False)
    await stage.clock.advance(1)  # 30 s for all three: one after another would take 90
    result = await waiting
    assert (result.status, result.usage.total_tokens, stage.model.peak) == (Status.DONE, 20 + 15, 3)


async def test_a_task_naming_no_team_mate_is_an_error_result_and_spawns_nothing(stage: Stage) -> None:
    lead = agent("lead", reply(calls=(task("x", "stranger"),)), reply("went on"), team=("worker",))
    runtime = await stage.create(lead, agent("worker", reply("w")))
    result = await stage.run(runtime, "lead", "go")
    assert result.status is Status.DONE
    assert tool_messages(runtime, "root/lead.1") == [("unknown team mate 'stranger'; your team is ['worker']", True)]
    assert [h.handle_id for h in runtime.list_handles()] == ["root/lead.1"]


@pytest.mark.parametrize(
    ("child", "budget", "told"),
    [
        (
            reply(stop=ReplyStop.PROVIDER_UNAVAILABLE),
            None,
            "[root/lead.1/worker.1 ERROR] model call failed: provider 'scripted' answered HTTP 503 (scripted failure)",
        ),
        (
            reply(calls=(("ping", {}),)),
            Budget(max_turns=1),
            "[root/lead.1/worker.1 INCOMPLETE LIMIT_MAX_TURNS] stopped at LIMIT_MAX_TURNS",
        ),
    ],
    ids=["its model failed", "it hit its turn limit"],
)
async def test_a_child_that_fails_reaches_its_parent_as_an_error_result_the_parent_goes_on(
    stage: Stage, child: ScriptedReply, budget: Budget | None, told: str
) -> None:
    lead = agent("lead", reply(calls=(task("try"),), tokens=10), reply("judged", tokens=10), team=("worker",))
    runtime = await stage.create(lead, agent("worker", child, budget=budget or Budget(), tools=(http_tool("ping"),)))
    result = await stage.run(runtime, "lead", "go")
    assert (result.status, result.text) == (Status.DONE, "judged")  # only the root's failure reaches the host
    assert tool_messages(runtime, "root/lead.1") == [(told, True)]
    assert runtime.inspect("root/lead.1/worker.1").last_status in (Status.ERROR, Status.INCOMPLETE)


# ---- a child's suspension ----------------------------------------------------------------------


async def test_a_childs_suspension_travels_to_the_root_naming_the_child(stage: Stage) -> None:
    runtime, pending = await delegated(stage, "0", suspending=("0",))
    request = pending_of(pending)
    assert (pending.status, pending.handle_id, request.kind, request.path) == (
        Status.PENDING,
        LEAD,
        "tool_call",
        ("root", "coordinator.1", "worker.1"),
    )
    assert (pending.usage.total_tokens, pending.usage.own_tokens) == (110, 100)
    states = {h.handle_id: (h.state, h.pending_kind) for h in runtime.list_handles()}
    assert states == {LEAD: (HandleState.SUSPENDED, "tool_call"), f"{LEAD}/worker.1": (HandleState.SUSPENDED, "tool_call")}
    assert (await stage.settled(runtime, f"{LEAD}/worker.1")).pending == request


async def test_resume_continues_the_child_then_the_parent_and_buys_no_turn_again(stage: Stage) -> None:
    runtime, pending = await delegated(stage, "0", suspending=("0",))
    request = pending_of(pending)
    done = await stage.answer(runtime, request, outputs=outputs_for(request, "data"))
    assert (done.handle_id, done.status, done.text) == (LEAD, Status.DONE, "all done")
    assert (done.usage.total_tokens, done.usage.own_tokens, done.usage.turns) == (220, 200, 2)
    assert (stage.model.calls["coordinator"], stage.model.calls["worker"]) == (2, 2)
    # The parent's task call, re-entered, reattached to the child: none spawned again.
    assert [h.handle_id for h in runtime.list_handles()] == [LEAD, f"{LEAD}/worker.1"]
    assert tool_messages(runtime, LEAD) == [("worker 0 done", False)]


async def test_a_fan_out_resume_replays_only_the_suspended_worker(stage: Stage) -> None:
    runtime, pending = await delegated(stage, "0", "1", "2", "3", suspending=("1",))
    request = pending_of(pending)
    assert request.path == ("root", "coordinator.1", "worker.2")
    done = await stage.answer(runtime, request, outputs=outputs_for(request, "x"))
    assert done.status is Status.DONE
    assert [runtime.inspect(f"{LEAD}/worker.{n}").usage.turns for n in (1, 2, 3, 4)] == [1, 2, 1, 1]
    assert (stage.model.calls["coordinator"], stage.model.calls["worker"]) == (2, 5)
    assert done.usage.total_tokens == 200 + 5 * 10


async def test_two_suspensions_in_one_turn_take_a_resume_each_in_any_order(stage: Stage) -> None:
    runtime, pending = await delegated(stage, "0", "1", "2", suspending=("0", "2"))
    first = pending_of(pending)
    assert first.path == ("root", "coordinator.1", "worker.1")
    third = pending_of(await stage.settled(runtime, f"{LEAD}/worker.3"))
    still = await stage.answer(runtime, third, outputs=outputs_for(third, "ok"))
    assert (still.handle_id, still.status, pending_of(still).id) == (LEAD, Status.PENDING, first.id)
    assert stage.model.calls["coordinator"] == 1
    done = await stage.answer(runtime, first, outputs=outputs_for(first, "ok"))
    assert (done.status, done.text) == (Status.DONE, "all done")
    assert (stage.model.calls["coordinator"], stage.model.calls["worker"]) == (2, 5)


async def test_interrupting_a_suspended_child_lets_its_parent_go_on(stage: Stage) -> None:
    runtime, pending = await delegated(stage, "0", suspending=("0",))
    child = f"{LEAD}/worker.1"
    assert await runtime.interrupt(child)
    assert (await stage.settled(runtime, child)).status is Status.INTERRUPTED
    done = await stage.settled(runtime, LEAD)
    assert (done.status, done.text) == (Status.DONE, "all done")
    [(told, is_error)] = tool_messages(runtime, LEAD)
    assert is_error and told.startswith(f"[{child} INTERRUPTED]")
    with pytest.raises(FailedPrecondition):
        await stage.answer(runtime, pending_of(pending))
    assert stage.model.calls["worker"] == 1


async def test_closing_a_suspended_parent_closes_its_child_and_cancels_the_request(stage: Stage) -> None:
    runtime, pending = await delegated(stage, "0", suspending=("0",))
    child = f"{LEAD}/worker.1"
    assert await runtime.close(LEAD, force=False) == [child, LEAD]
    assert [(await stage.settled(runtime, h)).status for h in (LEAD, child)] == [Status.CLOSED, Status.CLOSED]
    assert {h.state for h in runtime.list_handles()} == {HandleState.CLOSED}
    with pytest.raises(FailedPrecondition) as stale:
        await stage.answer(runtime, pending_of(pending))
    assert stale.value.reason == "NO_SUCH_REQUEST"
    assert stage.model.calls["coordinator"] == 1


async def test_interrupting_a_running_parent_withdraws_its_suspended_child(stage: Stage) -> None:
    runtime = await stage.create(coordinator("fast", "slow"), worker_suspending_on(stage, "fast", delays={"slow": 30}))
    await runtime.wake(await stage.spawn(runtime, "coordinator"), "go")
    await stage.clock.settle()
    fast, slow = f"{LEAD}/worker.1", f"{LEAD}/worker.2"
    request = pending_of(await stage.settled(runtime, fast))
    assert runtime.inspect(LEAD).state is HandleState.RUNNING  # its slow child still runs

    assert await runtime.interrupt(LEAD)
    assert (await stage.settled(runtime, LEAD)).status is Status.INTERRUPTED
    assert {h: runtime.inspect(h).state for h in (LEAD, fast, slow)} == dict.fromkeys((LEAD, fast, slow), HandleState.IDLE)
    withdrawn = await stage.settled(runtime, fast)
    assert (withdrawn.status, withdrawn.text) == (Status.INTERRUPTED, "the pending tool_call request was cancelled")
    with pytest.raises(FailedPrecondition):  # nothing could continue it under a rolled-back task call
        await stage.answer(runtime, request, outputs=outputs_for(request, "late"))
    assert [m.role for m in runtime.transcript(fast)] == ["user", "assistant", "tool"]  # its call has an answer


async def test_interrupting_a_suspended_parent_stops_the_child_a_resume_continued(stage: Stage) -> None:
    lead = agent("coordinator", reply(calls=(task("w"),)), reply("coordinated"), team=("worker",))
    worker = agent(
        "worker",
        reply(calls=(("fetch", {}),), tokens=5),
        reply("worker finished", tokens=5, delay=30),
        tools=(relay_tool("fetch"),),
    )
    runtime = await stage.create(lead, worker)
    request = pending_of(await stage.run(runtime, "coordinator", "go"))
    child = f"{LEAD}/worker.1"
    resuming = asyncio.ensure_future(stage.answer(runtime, request, outputs=outputs_for(request, "data")))
    await stage.clock.settle()
    assert (stage.model.in_flight, runtime.inspect(child).state, runtime.inspect(LEAD).state) == (
        1,
        HandleState.RUNNING,
        HandleState.SUSPENDED,
    )
    assert await runtime.interrupt(LEAD)
    assert (runtime.inspect(child).state, runtime.inspect(LEAD).state) == (HandleState.IDLE, HandleState.IDLE)
    resumed = await resuming  # the topmost handle it continued: the child, interrupted
    assert (resumed.handle_id, resumed.status) == (child, Status.INTERRUPTED)
    assert [(await stage.settled(runtime, h)).status for h in (LEAD, child)] == [Status.INTERRUPTED, Status.INTERRUPTED]
    assert stage.model.calls["coordinator"] == 1  # not continued on the interrupted result


async def test_a_retried_resume_under_a_parent_still_running_returns_the_childs_result(stage: Stage) -> None:
    runtime = await stage.create(coordinator("fast", "slow"), worker_suspending_on(stage, "fast", delays={"slow": 30}))
    await runtime.wake(await stage.spawn(runtime, "coordinator"), "go")
    await stage.clock.settle()
    request = pending_of(await stage.settled(runtime, f"{LEAD}/worker.1"))
    first = await stage.answer(runtime, request, outputs=outputs_for(request, "fetched"))
    assert (first.handle_id, first.status, first.text) == (f"{LEAD}/worker.1", Status.DONE, "worker fast done")
    again = await stage.answer(runtime, request, outputs=outputs_for(request, "fetched"))
    assert again == first  # not the coordinator's result, which waits on its slow child
    assert (runtime.inspect(LEAD).state, stage.model.calls["worker"]) == (HandleState.RUNNING, 3)


# ---- a judge that asks suspends the handle it judges -------------------------------------------


async def test_a_judge_that_asks_suspends_the_handle_it_judges(stage: Stage) -> None:
    writer = agent("writer", reply("draft", tokens=10), completion=CompletionGate(judge_agent="judge", max_attempts=1))
    judge = agent("judge", reply(calls=(("ask", {"question": "Is a draft enough?"}),), tokens=5), reply("PASS", tokens=5))
    runtime = await stage.create(writer, judge)
    result = await stage.run(runtime, "writer", "write")
    request = pending_of(result)
    assert (result.status, request.kind, request.prompt, "/".join(request.path)) == (
        Status.PENDING,
        "input",
        "Is a draft enough?",
        "root/writer.1/judge.1",
    )
    assert runtime.inspect("root/writer.1").state is HandleState.SUSPENDED
    done = await stage.answer(runtime, request, reason="yes")
    assert (done.handle_id, done.status, done.text) == ("root/writer.1", Status.DONE, "draft")
    assert (stage.model.calls["writer"], stage.model.calls["judge"], done.usage.turns, done.usage.total_tokens) == (1, 2, 1, 20)


async def test_the_completion_gate_counts_its_rejections_over_a_resume(stage: Stage) -> None:
    # A rejected answer, then a relay call, then rejected answers for ever.
    sloppy = agent(
        "sloppy",
        reply("nope", tokens=10),
        reply(calls=(("fetch", {}),), tokens=10),
        reply("nope", tokens=10),
        completion=CompletionGate(must_match="^VERIFIED", max_attempts=2),
        tools=(relay_tool("fetch"),),
    )
    runtime = await stage.create(sloppy)
    first = await stage.run(runtime, "sloppy", "verify it")
    assert (first.status, first.usage.turns) == (Status.PENDING, 2)  # rejected once, then the relay call
    request = pending_of(first)
    done = await stage.answer(runtime, request, outputs=outputs_for(request, "fetched"))
    # The second rejection (turn 3) is the last max_attempts allows: no fourth turn is bought.
    assert (done.status, done.limit, done.usage.turns, stage.model.calls["sloppy"]) == (Status.INCOMPLETE, Limit.COMPLETION, 3, 3)
    feedback = [m for m in runtime.transcript("root/sloppy.1") if m.role == "user"][1:]
    assert [m.content.startswith("Your answer was not accepted") for m in feedback] == [True]
