"""Restore and replay: a runtime read back from the memory store's journal (Runtime.restore) is
the same tree (handles, transcripts, figures, pending Requests) and arms and runs nothing; a
new process on the same store (a restart) resumes what was suspended, continues what was
running from its journal, and runs or buys nothing again that the journal recorded."""

from __future__ import annotations

import itertools
from typing import Any

from agentruntime_server.domain.journal import Tree, replay
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import Answer, HandleState, Heartbeat, Status

from tests.domain.harness import agent, http_tool, reply
from tests.domain.kit_suspension import (
    LEAD,
    WORKER,
    Stage,
    coordinator,
    outputs_for,
    pending_of,
    stage_approve_commit,
    task,
    tool_messages,
    worker_suspending_on,
)
from tests.support.story import figures


async def a_lived_in_runtime(stage: Stage) -> Runtime:
    """A tree with something of everything: a suspended child under a suspended parent, a
    finished run with figures, a message waiting in an inbox, a closed handle, a heartbeat
    that ticked."""
    beating = agent("beater", reply("beat", tokens=1), heartbeat=Heartbeat(every=60, prompt="tick"))
    runtime = await stage.create(coordinator("0", "1"), worker_suspending_on(stage, "1"), beating, runtime_id="lived")
    await stage.run(runtime, "coordinator", "go")
    await stage.spawn(runtime, "beater")
    await runtime.post(f"{LEAD}/worker.1", "later", "ops", "alice")
    closed = await stage.spawn(runtime, "beater")
    await runtime.close(closed, force=False)
    await stage.clock.advance(60)
    return runtime


async def test_a_runtime_restored_from_its_journal_is_the_same_tree(stage: Stage) -> None:
    runtime = await a_lived_in_runtime(stage)
    restored = await stage.reloaded(runtime)
    assert figures(restored.tree) == figures(runtime.tree)
    assert restored.list_handles() == runtime.list_handles()
    for handle in runtime.list_handles():
        assert restored.transcript(handle.handle_id) == runtime.transcript(handle.handle_id)
        assert restored.settled_result(restored.handle(handle.handle_id)) == runtime.settled_result(
            runtime.handle(handle.handle_id)
        )
    assert {request_id: h.pending for request_id, h in restored.tree.requests.items()} == {
        request_id: h.pending for request_id, h in runtime.tree.requests.items()
    }
    assert restored.inspect(f"{LEAD}/worker.1").inbox_size == 1
    states = {h.handle_id: h.state for h in restored.list_handles()}
    assert sorted(states.values(), key=lambda state: state.value) == [
        HandleState.IDLE,  # worker.1, done, a message in its inbox
        HandleState.IDLE,  # beater.1, ticked and done
        HandleState.SUSPENDED,  # worker.2
        HandleState.SUSPENDED,  # the coordinator
        HandleState.CLOSED,  # beater.2
    ]


async def test_a_restored_copy_arms_nothing_and_runs_nothing(stage: Stage) -> None:
    runtime = await a_lived_in_runtime(stage)
    timers = stage.clock.pending
    restored = await stage.reloaded(runtime)
    assert (restored.taken_over, restored.timers.armed, restored.runs.in_flight, stage.clock.pending) == (False, 0, False, timers)
    read = figures(restored.tree)
    calls = stage.model.calls["beater"]
    await stage.clock.advance(600)
    assert stage.model.calls["beater"] > calls  # the live copy ticked on
    assert figures(restored.tree) == read  # the restored one did nothing


async def test_replaying_the_journal_at_every_step_of_a_life_never_fails_and_ends_where_the_runtime_is(stage: Stage) -> None:
    runtime = await a_lived_in_runtime(stage)
    stored = await stage.store.load(runtime.key)
    assert stored is not None
    for upto in range(1, len(stored.entries) + 1):
        replay(Tree(runtime.key, stored.agents), stored.entries[:upto])
    rebuilt = Tree(runtime.key, stored.agents)
    replay(rebuilt, stored.entries)
    assert figures(rebuilt) == figures(runtime.tree)


# ---- after a restart -----------------------------------------------------------------------------


async def test_a_suspended_handle_is_resumed_after_a_restart_exactly_as_before(stage: Stage) -> None:
    runtime = await stage.create(stage_approve_commit(), runtime_id="plan")
    pending = await stage.run(runtime, "worker", "stage then commit")
    after = await stage.restarted()
    runtime = await after.service.runtime("plan")
    assert await stage.settled(runtime, WORKER) == pending
    snapshot = runtime.inspect(WORKER)
    assert (snapshot.state, snapshot.pending_kind) == (HandleState.SUSPENDED, "tool_call")
    request = pending_of(pending)
    done = await after.answer(runtime, request, outputs=outputs_for(request, "approved"))
    assert (done.status, done.text, done.usage.turns, done.usage.total_tokens) == (Status.DONE, "committed", 4, 200)
    assert (stage.tools.count("counter"), stage.model.calls["worker"]) == (2, 4)


async def test_a_copy_restored_with_runtime_restore_and_taken_over_resumes_what_was_suspended(stage: Stage) -> None:
    runtime = await stage.create(stage_approve_commit(), runtime_id="plan")
    request = pending_of(await stage.run(runtime, "worker", "stage then commit"))
    after = await stage.restarted(recover=False)  # nothing needs a process: nothing is taken over
    copy = await after.reloaded(runtime)
    assert (copy.taken_over, copy.inspect(WORKER).state, copy.inspect(WORKER).pending_kind) == (
        False,
        HandleState.SUSPENDED,
        "tool_call",
    )
    assert await copy.take_over() == 0  # nothing was running
    done = await after.answer(copy, request, outputs=outputs_for(request, "approved"))
    assert (done.status, done.text, done.usage.turns) == (Status.DONE, "committed", 4)
    assert (stage.tools.count("counter"), stage.model.calls["worker"]) == (2, 4)


async def test_a_nested_suspension_is_resumed_after_a_restart_child_then_parent(stage: Stage) -> None:
    runtime = await stage.create(coordinator("0"), worker_suspending_on(stage, "0"), runtime_id="nested")
    request = pending_of(await stage.run(runtime, "coordinator", "go"))
    after = await stage.restarted()
    runtime = await after.service.runtime("nested")
    done = await after.answer(runtime, request, outputs=outputs_for(request, "data"))
    assert (done.handle_id, done.status, done.usage.total_tokens) == (LEAD, Status.DONE, 220)
    assert (stage.model.calls["coordinator"], stage.model.calls["worker"]) == (2, 2)
    assert [h.handle_id for h in runtime.list_handles()] == [LEAD, f"{LEAD}/worker.1"]


async def test_a_retried_resume_after_a_restart_returns_what_the_first_returned(stage: Stage) -> None:
    runtime = await stage.create(
        coordinator("fast", "slow"), worker_suspending_on(stage, "fast", delays={"slow": 30}), runtime_id="retry"
    )
    await runtime.wake(await stage.spawn(runtime, "coordinator"), "go")
    await stage.clock.settle()
    request = pending_of(await stage.settled(runtime, f"{LEAD}/worker.1"))
    answer = Answer(id=request.id, ok=True, outputs=outputs_for(request, "fetched"))
    first = await stage.resumed(runtime, answer)
    stored = await stage.store.load(runtime.key)
    assert stored is not None
    rebuilt = Tree(runtime.key, stored.agents)
    replay(rebuilt, stored.entries)
    assert rebuilt.resumed_top == runtime.tree.resumed_top == {answer.id: first.handle_id}

    after = await stage.restarted()  # the coordinator goes on from its journal
    runtime = await after.service.runtime("retry")
    again = await stage.resumed(runtime, answer)
    assert (again.handle_id, again.status, again.text) == (first.handle_id, first.status, first.text)
    await after.clock.advance(30)
    assert (await stage.settled(runtime, LEAD)).text == "all done"
    assert stage.model.calls["worker"] == 4  # fast twice, slow cut by the restart and made again


async def test_a_child_running_at_a_crash_goes_on_and_its_parents_task_call_reattaches_to_it(stage: Stage) -> None:
    lead = agent("coordinator", reply(calls=(task("w"),), tokens=10), reply("coordinated", tokens=10), team=("worker",))
    runtime = await stage.create(lead, agent("worker", reply("worked", tokens=5, delay=30)), runtime_id="child")
    await runtime.wake(await stage.spawn(runtime, "coordinator"), "go")
    await stage.clock.advance(10)
    after = await stage.restarted()
    runtime = await after.service.runtime("child")
    assert (runtime.inspect(LEAD).state, runtime.inspect(f"{LEAD}/worker.1").state) == (HandleState.RUNNING, HandleState.RUNNING)
    await after.clock.advance(30)
    done = await stage.settled(runtime, LEAD)
    assert (done.status, done.text, done.usage.total_tokens) == (Status.DONE, "coordinated", 25)
    assert [h.handle_id for h in runtime.list_handles()] == [LEAD, f"{LEAD}/worker.1"]  # no second child
    assert (stage.model.calls["coordinator"], stage.model.calls["worker"]) == (2, 2)
    assert tool_messages(runtime, LEAD) == [("worked", False)]


async def test_results_recorded_before_a_crash_are_read_not_run_again(stage: Stage) -> None:
    stage.tools.delays["slow"] = 10
    both = agent(
        "both",
        reply(calls=(("quick", {}), ("slow", {})), tokens=10),
        reply("both done", tokens=10),
        tools=(http_tool("quick"), http_tool("slow")),
    )
    runtime = await stage.create(both, runtime_id="both")
    await runtime.wake(await stage.spawn(runtime, "both"), "go")
    await stage.clock.advance(5)  # quick answered and was recorded; slow is out
    after = await stage.restarted()
    await after.clock.advance(10)
    runtime = await after.service.runtime("both")
    done = await stage.settled(runtime, "root/both.1")
    assert (done.status, done.usage.turns, done.usage.tool_calls) == (Status.DONE, 2, 2)
    assert (stage.tools.count("quick"), stage.tools.count("slow"), stage.model.calls["both"]) == (1, 2, 2)
    assert tool_messages(runtime, "root/both.1") == [("quick ok #1", False), ("slow ok #2", False)]


async def test_no_figure_decreases_and_a_parents_total_is_its_own_plus_its_childrens_across_a_restart(stage: Stage) -> None:
    runtime = await stage.create(coordinator("0", "1", "2"), worker_suspending_on(stage, "1"), runtime_id="figures")
    request = pending_of(await stage.run(runtime, "coordinator", "go"))
    seen: list[dict[str, Any]] = [{h.handle_id: h.usage for h in runtime.list_handles()}]
    after = await stage.restarted()
    runtime = await after.service.runtime("figures")
    seen.append({h.handle_id: h.usage for h in runtime.list_handles()})
    await after.answer(runtime, request, outputs=outputs_for(request, "x"))
    seen.append({h.handle_id: h.usage for h in runtime.list_handles()})
    for earlier, later in itertools.pairwise(seen):
        for handle_id, usage in earlier.items():
            assert later[handle_id].total_tokens >= usage.total_tokens and later[handle_id].turns >= usage.turns
    for handle in runtime.handles.values():
        assert handle.usage.total_tokens == handle.usage.own_tokens + sum(child.usage.total_tokens for child in handle.children)
    assert seen[0] == seen[1]  # the restart moved no figure
