"""Compaction in the domain: when a request outgrows the agent's max_context_tokens, a
summarizer child writes a summary that stands in for the older turns in the model's view; the
transcript keeps every message, the summarizer's tokens bill to the tree, a summarizer that
asks suspends the handle it compacts, and a rolled-back run's turns are summarized no more."""

from __future__ import annotations

from agentruntime_server.domain.ports import ModelRequest
from agentruntime_server.domain.vocabulary import Budget, Compaction, ScriptedReply, Status

from tests.domain.harness import agent, http_tool, reply
from tests.domain.kit_suspension import Stage, last_user, pending_of, tool_results_sent

STEPS = 8
SUMMARY = "Steps so far all succeeded."
BIG = "x" * 2400


def stepper(request: ModelRequest) -> ScriptedReply:
    """One step call a turn, said at length, until the tool has run STEPS times (its output counts)."""
    last_tool = next((m.content for m in reversed(request.messages) if m.role == "tool"), None)
    done = int(last_tool.rsplit("#", 1)[1]) if last_tool else 0
    if done >= STEPS:
        return reply(f"all {STEPS} steps done", tokens=10)
    return reply(f"step {done + 1}: " + "noting progress " * 12, calls=(("step", {"n": done + 1}),), tokens=10)


async def test_compaction_lets_a_long_run_finish_and_keeps_every_message(stage: Stage) -> None:
    stage.model.choose["worker"] = stepper
    compaction = Compaction(max_context_tokens=250, keep_last_turns=2, summarizer_agent="summarizer")
    worker = agent("worker", reply("chosen"), tools=(http_tool("step"),), compaction=compaction)
    runtime = await stage.create(worker, agent("summarizer", reply(SUMMARY, tokens=7)))
    result = await stage.run(runtime, "worker", "run the steps")
    usage = result.usage
    assert (result.status, result.text, usage.turns, usage.tool_calls) == (
        Status.DONE,
        f"all {STEPS} steps done",
        STEPS + 1,
        STEPS,
    )
    assert stage.tools.count("step") == STEPS  # no step ran twice

    messages = runtime.transcript(result.handle_id)
    originals = [m for m in messages if not m.summary]
    summaries = [m for m in messages if m.summary]
    assert [m.role for m in originals] == ["user", *["assistant", "tool"] * STEPS, "assistant"]
    assert [m.content for m in originals if m.role == "tool"] == [f"step ok #{n}" for n in range(1, STEPS + 1)]
    assert len(summaries) >= 2, "the view outgrows the limit again after a compaction: it compacts again"
    assert all(m.role == "user" and m.content == f"Summary of the conversation so far:\n{SUMMARY}" for m in summaries)
    # The model was sent the summary and the turns after it, never the whole transcript again.
    last = stage.model.sent("worker")[-1]
    assert last.messages[0].summary and len(last.messages) < len(originals)
    # Each later summarizer is told the summary before it.
    asked = [last_user(request) for request in stage.model.sent("summarizer")]
    before = f"Summary of what came before:\nSummary of the conversation so far:\n{SUMMARY}"
    assert before not in asked[0] and all(before in prompt for prompt in asked[1:])

    summarizers = [h for h in runtime.list_handles() if h.agent == "summarizer"]
    assert len(summarizers) == len(summaries) == stage.model.calls["summarizer"]
    assert all(h.parent_id == result.handle_id and h.last_status is Status.DONE for h in summarizers)
    assert usage.own_tokens == (STEPS + 1) * 10
    assert usage.total_tokens == usage.own_tokens + 7 * len(summarizers)


async def test_a_summarizer_that_asks_suspends_the_handle_it_compacts(stage: Stage) -> None:
    def worker(request: ModelRequest) -> ScriptedReply:
        # A big call, a small one (too big now, but its one turn is kept), then the request
        # that is compacted: the summarizer asks the host first.
        if any(m.summary for m in request.messages):
            return reply("done", tokens=10)
        return reply(calls=(("noop", {"blob": BIG} if tool_results_sent(request) == 0 else {}),), tokens=10)

    stage.model.choose["w"] = worker
    compaction = Compaction(max_context_tokens=500, keep_last_turns=1, summarizer_agent="sum")
    summarizer = agent(
        "sum", reply(calls=(("ask", {"question": "Keep the blob?"}),), tokens=3), reply("SUMMARY: a blob was sent", tokens=3)
    )
    runtime = await stage.create(agent("w", reply("chosen"), tools=(http_tool("noop"),), compaction=compaction), summarizer)
    # (A turn cap: a handle that went on without its summary would never be shown one.)
    result = await stage.run(runtime, "w", "zero", budget=Budget(max_turns=5))
    request = pending_of(result)
    assert (result.status, "/".join(request.path), request.prompt) == (
        Status.PENDING,
        f"{result.handle_id}/sum.1",
        "Keep the blob?",
    )
    assert stage.model.calls["w"] == 2  # no third call without the summary it waits for

    done = await stage.answer(runtime, request, reason="no")
    assert (done.handle_id, done.status, done.text) == (result.handle_id, Status.DONE, "done")
    sent = stage.model.sent("w")[-1].messages
    assert any(m.role == "user" and "SUMMARY: a blob was sent" in m.content for m in sent)
    assert (stage.model.calls["w"], stage.model.calls["sum"]) == (3, 2)


async def test_a_compaction_after_a_rolled_back_run_is_written_again_without_it(stage: Stage) -> None:
    run = {"number": 0, "turns": 0}

    def worker(request: ModelRequest) -> ScriptedReply:
        if run["number"] == 0:
            return reply(calls=(("noop", {}),), tokens=10) if tool_results_sent(request) == 0 else reply("r0", tokens=10)
        if run["number"] == 1:
            run["turns"] += 1
            if run["turns"] == 1:
                return reply(calls=(("noop", {"blob": BIG}),), tokens=10)
            return reply("late", tokens=10, delay=30)  # interrupted at the model
        return reply("r2", tokens=10)

    asked: list[str] = []

    def summarizer(request: ModelRequest) -> ScriptedReply:
        asked.append(last_user(request))
        return reply(f"SUMMARY#{len(asked)} mentions-one={'user: one' in asked[-1]}", tokens=3)

    stage.model.choose.update(w=worker, sum=summarizer)
    compaction = Compaction(max_context_tokens=500, keep_last_turns=1, summarizer_agent="sum")
    runtime = await stage.create(
        agent("w", reply("chosen"), tools=(http_tool("noop"),), compaction=compaction), agent("sum", reply("chosen"))
    )
    zero = await stage.run(runtime, "w", "zero")
    handle_id = zero.handle_id
    assert zero.status is Status.DONE

    run["number"] = 1
    await runtime.wake(handle_id, "one")
    await stage.clock.advance(1)
    assert (len(asked), stage.model.in_flight) == (1, 1)  # compacted, and the next turn is at the model
    await runtime.interrupt(handle_id)
    assert (await stage.settled(runtime, handle_id)).status is Status.INTERRUPTED  # run one is rolled back

    run["number"] = 2
    await runtime.wake(handle_id, "two " + BIG)
    await stage.clock.settle()
    assert (await stage.settled(runtime, handle_id)).text == "r2"
    assert len(asked) == 2 and "user: one" not in asked[1]  # summarized again, without the rolled-back run
    summaries = [m.content for m in stage.model.sent("w")[-1].messages if m.summary]
    assert summaries == ["Summary of the conversation so far:\nSUMMARY#2 mentions-one=False"]
    assert sorted(h.handle_id for h in runtime.list_handles() if h.agent == "sum") == [f"{handle_id}/sum.1", f"{handle_id}/sum.2"]
