"""The completion gate and typed outputs in a running runtime (runs/completion_gate.py,
runs/typed_answers.py; docs/budgets.md, docs/typed-results.md): a final answer is accepted only
if it matches the agent's pattern, its judge says PASS, and (with an output_schema) it is JSON
matching the schema that every client can be sent. A rejected answer goes back to the model
with the reason; the rejections, counted from the transcript, run out into LIMIT_COMPLETION."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from agentruntime_server.domain.vocabulary import (
    AgentSpec,
    Budget,
    CompletionGate,
    HandleState,
    Limit,
    ReplyStop,
    ScriptedReply,
    Status,
)

from tests.domain.harness import Bench, agent, reply
from tests.domain.kit_turns import NEVER_HANGS, Benches, child_of
from tests.support.typed import CLASSIFICATION

pytestmark = NEVER_HANGS

GOOD = {"label": "bug", "confidence": 0.75, "tags": ["crash", "ui"]}
NOT_ACCEPTED = "Your answer was not accepted: "


def feedback(messages: list[Any]) -> list[str]:
    """The gate's feedback messages, in order."""
    return [m.content for m in messages if m.role == "user" and m.content.startswith(NOT_ACCEPTED)]


# ---- must_match and max_attempts ------------------------------------------------------------


async def test_an_answer_that_does_not_match_goes_back_with_the_reason_and_the_next_wins(bench: Bench) -> None:
    gate = CompletionGate(must_match=r"^\d+$", max_attempts=2)
    runtime = await bench.create(agent("counter", reply("about five"), reply("5"), completion=gate))
    result = await bench.run(runtime, "counter", "how many?")
    assert (result.status, result.text, result.usage.turns, result.limit) == (Status.DONE, "5", 2, Limit.NONE)
    messages = runtime.transcript(result.handle_id)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert feedback(messages) == [
        "Your answer was not accepted: the answer does not match '^\\\\d+$'. Revise it and answer again."
    ]


async def test_rejections_run_out_into_limit_completion_with_the_last_reason(bench: Bench) -> None:
    gate = CompletionGate(must_match="^yes", max_attempts=3)
    runtime = await bench.create(agent("stubborn", reply("no", tokens=4), completion=gate))
    result = await bench.run(runtime, "stubborn", "agree")
    assert (result.status, result.limit, result.text) == (Status.INCOMPLETE, Limit.COMPLETION, "the answer does not match '^yes'")
    assert (result.usage.turns, result.usage.own_tokens) == (3, 12)  # every attempt's turn counts
    assert len(feedback(runtime.transcript(result.handle_id))) == 2  # none after the last


async def test_rejections_are_counted_from_the_transcript_across_a_resume(bench: Bench) -> None:
    gate = CompletionGate(must_match="^final: ", max_attempts=2)
    drafter = agent(
        "drafter",
        reply("a draft"),
        reply(calls=(("ask", {"question": "what tone?"}),)),
        reply("still a draft"),
        reply("final: done"),
        completion=gate,
    )
    runtime = await bench.create(drafter)
    asked = await bench.run(runtime, "drafter", "write")
    assert asked.status is Status.PENDING and asked.pending is not None and asked.pending.kind == "input"
    result = await bench.resume(runtime, asked, data={"tone": "dry"})
    # The draft before the Resume was the first rejection: the one after it is the second, and last.
    assert (result.status, result.limit, result.usage.turns) == (Status.INCOMPLETE, Limit.COMPLETION, 3)


# ---- a judge --------------------------------------------------------------------------------


async def test_a_judge_that_fails_an_answer_sends_its_reason_back_and_its_turns_bill_to_the_tree(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("judge", reply("FAIL: too short", tokens=5), reply("PASS", tokens=5), by_call=True)
    writer = agent(
        "writer",
        reply("short", tokens=10),
        reply("a longer answer", tokens=10),
        completion=CompletionGate(judge_agent="judge", max_attempts=2),
    )
    runtime = await bench.create(writer, agent("judge"))
    result = await bench.run(runtime, "writer", "write it")
    assert (result.status, result.text) == (Status.DONE, "a longer answer")
    assert feedback(runtime.transcript(result.handle_id)) == [
        "Your answer was not accepted: the judge 'judge' said: FAIL: too short. Revise it and answer again."
    ]
    judges = runtime.handle(result.handle_id).children
    assert [judge.child_key for judge in judges] == ["judge_turn_1", "judge_turn_2"]  # one per answer judged
    assert (result.usage.own_tokens, result.usage.total_tokens) == (20, 30)
    first = model.requests[0].messages[-1].content
    assert first.startswith("Task:\nwrite it\n\nProposed answer:\nshort\n\n") and "Reply PASS" in first


async def test_a_judge_that_asks_suspends_the_handle_it_judges_until_answered(bench: Bench) -> None:
    judge = agent("judge", reply(calls=(("ask", {"question": "is it right?"}),)), reply("PASS"))
    writer = agent("writer", reply("the answer"), completion=CompletionGate(judge_agent="judge"))
    runtime = await bench.create(writer, judge)
    pending = await bench.run(runtime, "writer", "go")
    request = pending.pending
    assert request is not None and pending.status is Status.PENDING
    assert (request.kind, request.prompt, request.path[-1]) == ("input", "is it right?", "judge.1")
    assert runtime.handle(pending.handle_id).state is HandleState.SUSPENDED
    done = await bench.resume(runtime, pending, data={"verdict": "yes"})
    assert (done.status, done.text, done.handle_id) == (Status.DONE, "the answer", pending.handle_id)
    assert child_of(runtime, pending.handle_id, "judge").usage.turns == 2


async def test_the_answer_of_the_last_allowed_turn_is_judged(bench: Bench) -> None:
    answering = agent(
        "a",
        reply("the answer", tokens=10),
        budget=Budget(max_turns=1),
        completion=CompletionGate(judge_agent="j", max_attempts=2),
    )
    runtime = await bench.create(answering, agent("j", reply("PASS", tokens=5), budget=Budget(max_turns=3)))
    result = await bench.run(runtime, "a", "go")
    # A judge works on the judged handle's turns: its own max_turns stands (carved, it would get none).
    assert (result.status, result.text, result.limit) == (Status.DONE, "the answer", Limit.NONE), result
    assert (result.usage.turns, result.usage.own_tokens, result.usage.total_tokens) == (1, 10, 15)
    judge = child_of(runtime, result.handle_id)
    assert (judge.budget.max_turns, judge.usage.turns) == (3, 1)


# ---- typed outputs --------------------------------------------------------------------------


# What the wire reads from an AgentDef whose gate is unset: max_attempts 0, "the default"
# (CompletionGate() in the domain says 1, which for a typed agent is not the default of 3).
UNSET_GATE = CompletionGate(max_attempts=0)


def typed(name: str, *replies: ScriptedReply, schema: dict[str, Any] | None = None, **fields: Any) -> AgentSpec:
    fields.setdefault("completion", UNSET_GATE)
    made: AgentSpec = agent(name, *replies, output_schema=schema or CLASSIFICATION, **fields)
    return made


async def test_a_wrong_typed_answer_goes_back_as_a_slip_and_the_second_is_the_output(bench: Bench) -> None:
    wrong = reply('{"label": "bug", "confidence": 1.5, "tags": []}')
    runtime = await bench.create(typed("classifier", wrong, reply(json.dumps(GOOD))))
    result = await bench.run(runtime, "classifier", "The app crashes when I click Save.")
    assert (result.status, result.usage.turns, result.limit) == (Status.DONE, 2, Limit.NONE)
    assert result.output == GOOD and json.loads(result.text) == GOOD
    [slip] = feedback(runtime.transcript(result.handle_id))
    assert "the answer does not match the output schema" in slip and "1.5 is greater than the maximum of 1" in slip


async def test_typed_answers_get_three_attempts_unless_the_gate_says_and_no_output_when_they_run_out(bench: Bench) -> None:
    runtime = await bench.create(
        typed("default", reply("[1, 2]")),
        typed("stubborn", reply("It is a bug, I think."), completion=CompletionGate(max_attempts=2)),
    )
    default = await bench.run(runtime, "default", "Classify.")
    assert (default.status, default.limit, default.usage.turns, default.output) == (Status.INCOMPLETE, Limit.COMPLETION, 3, None)
    stubborn = await bench.run(runtime, "stubborn", "Classify.")
    assert (stubborn.status, stubborn.limit, stubborn.usage.turns, stubborn.output) == (
        Status.INCOMPLETE,
        Limit.COMPLETION,
        2,
        None,
    )
    assert "it is not JSON" in stubborn.text


async def test_a_typed_answer_is_judged_against_its_schema_before_the_judge_reads_it(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("judge", reply("PASS"))
    classifier = typed(
        "classifier",
        reply("bug, surely"),
        reply(json.dumps(GOOD)),
        completion=CompletionGate(judge_agent="judge", max_attempts=3),
    )
    runtime = await bench.create(classifier, agent("judge"))
    result = await bench.run(runtime, "classifier", "Classify.")
    assert (result.status, result.output) == (Status.DONE, GOOD)
    assert model.calls["judge"] == 1  # the answer that was not JSON never reached the judge
    assert [judge.child_key for judge in runtime.handle(result.handle_id).children] == ["judge_turn_2"]


async def test_a_cut_off_typed_answer_has_no_output(bench: Bench) -> None:
    runtime = await bench.create(typed("classifier", reply(json.dumps(GOOD), stop=ReplyStop.MAX_OUTPUT_TOKENS)))
    result = await bench.run(runtime, "classifier", "Classify.")
    assert (result.status, result.limit, result.output) == (Status.INCOMPLETE, Limit.MAX_OUTPUT_TOKENS, None)


async def test_a_childs_typed_answer_reaches_its_parent_as_json_and_its_schema_is_shown(benches: Benches) -> None:
    bench, model = await benches.planned()
    model.plan("lead", reply(calls=(("task", {"agent": "classifier", "prompt": "classify the crash"}),)), reply("classified"))
    runtime = await bench.create(agent("lead", team=("classifier",)), typed("classifier", reply(json.dumps(GOOD))))
    result = await bench.run(runtime, "lead", "triage")
    assert (result.status, result.text, result.output) == (Status.DONE, "classified", None)  # the lead has no schema
    [tool] = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert json.loads(tool.content) == GOOD and not tool.is_error
    [task] = [schema for schema in model.requests[0].tools if schema.name == "task"]
    assert '"required":["label","confidence","tags"]' in task.description


ANYTHING = {"type": "object"}
CARRIED = {"n": 1, "deep": [[["ok"]]], "nothing": {}, "none": [], "null": None}  # empty containers stay what they are


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def unnested(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = value["a"]
    return value


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ('{"n": ' + str(2**1024) + "}", "$.n is an integer past a double's range"),
        ('{"n": 1e400}', "$.n is inf, not a finite number"),
        (nested(33), "nests deeper than 32 levels"),
        ('{"n": "\\ud800"}', "$.n is text that is not valid Unicode"),
        ('{"\\udfff": 1}', "has a key that is not valid Unicode text"),
    ],
    ids=["integer-past-a-double", "infinite", "33-levels", "lone-surrogate", "lone-surrogate-key"],
)
async def test_a_typed_answer_no_client_can_be_sent_is_a_slip_and_the_next_one_wins(bench: Bench, answer: str, says: str) -> None:
    runtime = await bench.create(typed("typed", reply(answer), reply(json.dumps(CARRIED)), schema=ANYTHING))
    result = await bench.run(runtime, "typed", "answer")
    assert (result.status, result.usage.turns, result.output) == (Status.DONE, 2, CARRIED)
    [slip] = feedback(runtime.transcript(result.handle_id))
    assert "the answer must be JSON every client can read" in slip and says in slip


@pytest.mark.parametrize(
    ("answer", "read"),
    [
        ('{"n": ' + str(int(sys.float_info.max)) + "}", lambda output: output["n"] == int(sys.float_info.max)),
        ('{"n": 1e308}', lambda output: output["n"] == 1e308),
        (nested(32), lambda output: unnested(output, 32) == 1),
        ('{"n": "\\ud83d\\ude00"}', lambda output: output["n"] == "\N{GRINNING FACE}"),  # a surrogate pair is one character
        (json.dumps(CARRIED), lambda output: output == CARRIED),
    ],
    ids=["largest-double-integer", "large-float", "32-levels", "surrogate-pair", "empty-containers"],
)
async def test_a_typed_answer_at_the_edge_of_what_clients_carry_is_the_output(bench: Bench, answer: str, read: Any) -> None:
    runtime = await bench.create(typed("typed", reply(answer), schema=ANYTHING))
    result = await bench.run(runtime, "typed", "answer")
    assert (result.status, result.usage.turns) == (Status.DONE, 1), result.text
    assert read(result.output)
