"""Calls in doubt: a call that was out when its process stopped, or whose http attempt was cut
once its request was sent, may or may not have acted. Its tool's on_interrupted policy decides:
RETRY (the default) sends it again with the same idempotency key, ASK suspends on an `in_doubt`
Request. The process is stopped and another started on the same memory store, which takes the
runtime over from its journal (RuntimeService.recover); the http attempts are the in-process
tools raising what the http tool runner raises (ports.CallInDoubt, ports.CallNotSent)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agentruntime_server.domain.errors import InvalidArgument
from agentruntime_server.domain.ports import CallInDoubt, CallNotSent
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import Answer, HandleState, OnInterrupted, Status, ToolOutput

from tests.domain.harness import agent, http_tool, reply
from tests.domain.kit_suspension import Stage, pending_of, tool_messages
from tests.support.story import figures

PAYER = "root/payer.1"
KEY = f"pay/{PAYER}/call_1_1"
CUT = "the connection was lost after the request was sent"
UNREACHABLE = "the tool's endpoint could not be reached"
MAY_HAVE = "the call may or may not have taken effect"


def payer(policy: OnInterrupted = OnInterrupted.DEFAULT) -> Any:
    """One turn charging 500 cents, then an answer."""
    return agent(
        "payer",
        reply(calls=(("charge", {"cents": 500}),), tokens=30),
        reply("paid", tokens=20),
        tools=(http_tool("charge", on_interrupted=policy),),
    )


def fails_first(stage: Stage, *errors: Exception) -> None:
    """charge's first attempts raise `errors` in turn, then it answers."""
    left = list(errors)

    def body(arguments: dict[str, Any]) -> str:
        if left:
            raise left.pop(0)
        return f"charge ok #{stage.tools.count('charge')}"

    stage.tools.bodies["charge"] = body


async def cut_by_a_crash(stage: Stage, policy: OnInterrupted) -> tuple[Stage, Runtime]:
    """The charge call is out (it takes 10 s) when the process stops; another takes over."""
    stage.tools.delays["charge"] = 10
    runtime = await stage.create(payer(policy), runtime_id="pay")
    await runtime.wake(await stage.spawn(runtime, "payer"), "pay")
    await stage.clock.settle()
    assert (stage.tools.keys("charge"), runtime.inspect(PAYER).state) == ([KEY], HandleState.RUNNING)
    after = await stage.restarted()
    return after, await after.service.runtime("pay")


# ---- a call out when the process stopped -------------------------------------------------------


@pytest.mark.parametrize("policy", [OnInterrupted.DEFAULT, OnInterrupted.RETRY])
async def test_a_call_out_at_a_crash_is_sent_again_with_the_same_key_under_retry(stage: Stage, policy: OnInterrupted) -> None:
    after, runtime = await cut_by_a_crash(stage, policy)
    await after.clock.advance(10)
    done = await stage.settled(runtime, PAYER)
    assert (done.status, done.text, done.usage.turns, done.usage.tool_calls) == (Status.DONE, "paid", 2, 1)
    assert stage.tools.keys("charge") == [KEY, KEY]
    assert tool_messages(runtime, PAYER) == [("charge ok #2", False)]
    assert stage.model.calls["payer"] == 2  # the first turn's reply was journaled: it is not bought again


async def test_with_ask_a_call_out_at_a_crash_suspends_on_an_in_doubt_request(stage: Stage) -> None:
    after, runtime = await cut_by_a_crash(stage, OnInterrupted.ASK)
    pending = await stage.settled(runtime, PAYER)
    request = pending_of(pending)
    [(call, key)] = request.calls
    assert (pending.status, request.kind, call.name, call.arguments_json, key) == (
        Status.PENDING,
        "in_doubt",
        "charge",
        '{"cents": 500}',
        KEY,
    )
    assert request.prompt.startswith('charge {"cents": 500} was cut off before it answered')
    assert runtime.inspect(PAYER).state is HandleState.SUSPENDED
    await after.clock.advance(60)
    assert stage.tools.keys("charge") == [KEY]  # asked, never sent again on its own


@pytest.mark.parametrize(
    ("answer", "sent", "told"),
    [
        ({}, 2, ("charge ok #2", False)),  # ok without an output: run it again, with the same key
        ({"outputs": (ToolOutput("", "it went through"),)}, 1, ("it went through", False)),
        ({"ok": False, "reason": "refunded"}, 1, ("failed by the host (it was in doubt): refunded", True)),
    ],
    ids=["run it again", "the host's output is the result", "fail it"],
)
async def test_the_answer_to_an_in_doubt_request_decides_the_call(
    stage: Stage, answer: dict[str, Any], sent: int, told: tuple[str, bool]
) -> None:
    after, runtime = await cut_by_a_crash(stage, OnInterrupted.ASK)
    request = pending_of(await stage.settled(runtime, PAYER))
    stage.tools.delays.clear()
    done = await after.answer(runtime, request, **answer)
    assert (done.status, done.text, done.usage.tool_calls) == (Status.DONE, "paid", 1)
    assert tool_messages(runtime, PAYER) == [told]
    assert stage.tools.keys("charge") == [KEY] * sent
    assert stage.model.calls["payer"] == 2


async def test_an_in_doubt_request_takes_one_output_for_its_own_call_only(stage: Stage) -> None:
    _, runtime = await cut_by_a_crash(stage, OnInterrupted.ASK)
    request = pending_of(await stage.settled(runtime, PAYER))
    before = figures(runtime.tree)
    for outputs in ((ToolOutput("call_9_9", "x"),), (ToolOutput("", "a"), ToolOutput("", "b"))):
        with pytest.raises(InvalidArgument) as refused:
            await stage.resumed(runtime, Answer(id=request.id, ok=True, outputs=outputs))
        assert [v.field for v in refused.value.violations] == ["answer.outputs"]
    assert figures(runtime.tree) == before and stage.tools.keys("charge") == [KEY]


async def test_a_model_call_out_at_a_crash_is_made_again_and_its_turn_counted_once(stage: Stage) -> None:
    runtime = await stage.create(agent("slow", reply("late", tokens=10, delay=30)), runtime_id="slow")
    await runtime.wake(await stage.spawn(runtime, "slow"), "go")
    await stage.clock.advance(10)
    assert stage.model.in_flight == 1
    after = await stage.restarted()
    runtime = await after.service.runtime("slow")
    await after.clock.advance(30)
    done = await stage.settled(runtime, "root/slow.1")
    assert (done.status, done.text, done.usage.turns, done.usage.own_tokens) == (Status.DONE, "late", 1, 10)
    assert stage.model.calls["slow"] == 2  # its reply never came: the call is made again, and billed once


# ---- an http attempt cut once its request was sent -----------------------------------------------


async def test_with_retry_a_cut_attempt_is_sent_again_after_a_pause_with_the_same_key(stage: Stage) -> None:
    fails_first(stage, CallInDoubt(CUT))
    runtime = await stage.create(payer(), runtime_id="pay")
    await runtime.wake(await stage.spawn(runtime, "payer"), "pay")
    waiting = asyncio.ensure_future(runtime.wait(PAYER, None))
    await stage.clock.advance(0.9)
    assert (stage.tools.keys("charge"), waiting.done()) == ([KEY], False)  # the pause before the resend
    await stage.clock.advance(0.1)
    done = await waiting
    assert (done.status, done.usage.tool_calls) == (Status.DONE, 1)
    assert stage.tools.keys("charge") == [KEY, KEY]
    assert [arguments for _, arguments, _ in stage.tools.calls] == [{"cents": 500}] * 2
    assert tool_messages(runtime, PAYER) == [("charge ok #2", False)]


async def test_with_retry_three_cut_attempts_tell_the_model_the_call_may_have_acted(stage: Stage) -> None:
    fails_first(stage, *(CallInDoubt("no reply within 0.3s of sending the request") for _ in range(3)))
    runtime = await stage.create(payer(OnInterrupted.RETRY), runtime_id="pay")
    await runtime.wake(await stage.spawn(runtime, "payer"), "pay")
    await stage.clock.advance(2.9)
    assert len(stage.tools.keys("charge")) == 2  # after 1 s, then 2 s more
    await stage.clock.advance(0.1)
    done = await stage.settled(runtime, PAYER)
    assert done.status is Status.DONE  # the model is told, and goes on
    assert stage.tools.keys("charge") == [KEY] * 3
    assert tool_messages(runtime, PAYER) == [
        (f"no answer in 3 attempts with the same Idempotency-Key (no reply within 0.3s of sending the request): {MAY_HAVE}", True)
    ]


async def test_a_call_in_doubt_stays_in_doubt_when_the_resends_reach_nothing(stage: Stage) -> None:
    fails_first(stage, CallInDoubt(CUT), CallNotSent(UNREACHABLE), CallNotSent(UNREACHABLE))
    runtime = await stage.create(payer(), runtime_id="pay")
    await runtime.wake(await stage.spawn(runtime, "payer"), "pay")
    await stage.clock.advance(3)
    assert (await stage.settled(runtime, PAYER)).status is Status.DONE
    assert tool_messages(runtime, PAYER) == [
        (f"no answer in 3 attempts with the same Idempotency-Key ({CUT}; {UNREACHABLE}): {MAY_HAVE}", True)
    ]


async def test_an_attempt_that_reached_nothing_is_a_plain_error_tried_once(stage: Stage) -> None:
    fails_first(stage, CallNotSent(UNREACHABLE))
    runtime = await stage.create(payer(OnInterrupted.ASK), runtime_id="pay")
    await runtime.wake(await stage.spawn(runtime, "payer"), "pay")
    await stage.clock.advance(5)
    assert (await stage.settled(runtime, PAYER)).status is Status.DONE  # not in doubt: nothing to ask
    assert tool_messages(runtime, PAYER) == [(UNREACHABLE, True)]
    assert stage.tools.keys("charge") == [KEY]


async def test_with_ask_a_cut_attempt_suspends_in_doubt_and_the_hosts_output_is_the_result(stage: Stage) -> None:
    fails_first(stage, CallInDoubt(CUT))
    runtime = await stage.create(payer(OnInterrupted.ASK), runtime_id="pay")
    request = pending_of(await stage.run(runtime, "payer", "pay"))
    assert request.kind == "in_doubt" and "the connection to its endpoint was lost" in request.prompt
    assert stage.tools.keys("charge") == [KEY]  # asked, not sent again
    done = await stage.answer(runtime, request, outputs=(ToolOutput(request.calls[0][0].id, "it went through"),))
    assert (done.status, tool_messages(runtime, PAYER)) == (Status.DONE, [("it went through", False)])
    assert stage.tools.keys("charge") == [KEY]


async def test_a_call_in_doubt_again_after_the_host_had_it_run_again_asks_anew(stage: Stage) -> None:
    fails_first(stage, CallInDoubt(CUT), CallInDoubt(CUT))
    runtime = await stage.create(payer(OnInterrupted.ASK), runtime_id="pay")
    first = pending_of(await stage.run(runtime, "payer", "pay"))
    again = await stage.answer(runtime, first)  # run it again: cut again
    second = pending_of(again)
    assert (first.id, second.id) == (f"{PAYER}/call_1_1:in_doubt", f"{PAYER}/call_1_1:in_doubt.2")
    assert await stage.answer(runtime, first) == again  # the retried first answer is not an answer to the second
    assert stage.tools.keys("charge") == [KEY, KEY]
    done = await stage.answer(runtime, second)
    assert (done.status, stage.tools.keys("charge")) == (Status.DONE, [KEY] * 3)
    assert tool_messages(runtime, PAYER) == [("charge ok #3", False)]
