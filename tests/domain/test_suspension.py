"""Suspension and Resume in the domain (docs/suspension.md): a relay call, an approval or a
question suspends the handle on a Request; Resume continues from the checkpoint, so nothing
already done is run or bought again (the scripted model's calls and the http tools' calls are
counted); a bad Answer is refused and changes nothing; a retried Resume returns what the first
returned; a tool's Request with an expiry lapses when the fake clock passes it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agentruntime_server.domain.errors import FailedPrecondition, InvalidArgument
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import (
    Answer,
    Guardrail,
    GuardrailAction,
    HandleState,
    Status,
    ToolOutput,
    ToolSuspension,
)

from tests.domain.harness import agent, http_tool, reply
from tests.domain.kit_suspension import (
    WORKER,
    Stage,
    gated_tool,
    outputs_for,
    pending_of,
    relay_tool,
    stage_approve_commit,
    tool_messages,
)
from tests.support.story import figures


async def suspended_on_approve(stage: Stage) -> tuple[Runtime, Any]:
    runtime = await stage.create(stage_approve_commit(), runtime_id="plan")
    return runtime, await stage.run(runtime, "worker", "stage then commit")


async def unchanged(stage: Stage, runtime: Runtime) -> tuple[Any, int]:
    """Everything the journal built, and how many entries the store holds: what a refusal must leave alone."""
    stored = await stage.store.load(runtime.key)
    assert stored is not None
    return figures(runtime.tree), len(stored.entries)


# ---- relay calls -------------------------------------------------------------------------------


async def test_a_relay_call_suspends_the_handle_with_typed_calls_and_their_idempotency_keys(stage: Stage) -> None:
    runtime, pending = await suspended_on_approve(stage)
    assert (pending.status, pending.handle_id, pending.usage.turns, pending.usage.total_tokens) == (
        Status.PENDING,
        WORKER,
        2,
        100,
    )
    request = pending_of(pending)
    [(call, key)] = request.calls
    assert (request.kind, request.path, call.name, call.arguments_json) == ("tool_call", ("root", "worker.1"), "approve", "{}")
    assert key == f"plan/{WORKER}/{call.id}" == request.data["calls"][0]["idempotency_key"]
    assert request.prompt == "Run approve and Resume with one output per call"
    snapshot = runtime.inspect(WORKER)
    assert (snapshot.state, snapshot.pending_kind) == (HandleState.SUSPENDED, "tool_call")
    assert (stage.tools.count("counter"), stage.model.calls["worker"]) == (1, 2)
    # What a Resume replays: the assistant message that made the call is in the transcript already.
    transcript = runtime.transcript(WORKER)
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert [c.name for c in transcript[-1].tool_calls] == ["approve"]
    assert await stage.settled(runtime, WORKER) == pending  # a Wait reads the same pending result


async def test_resume_continues_from_the_checkpoint_and_runs_or_buys_nothing_again(stage: Stage) -> None:
    runtime, pending = await suspended_on_approve(stage)
    request = pending_of(pending)
    done = await stage.answer(runtime, request, outputs=outputs_for(request, "approved"))
    assert (done.status, done.text, done.handle_id) == (Status.DONE, "committed", WORKER)
    # Stage ran once before the suspension, commit once after it; two turns before, two after.
    assert [arguments["step"] for _, arguments, _ in stage.tools.calls] == ["stage", "commit"]
    assert stage.model.calls["worker"] == 4
    usage = done.usage
    assert (usage.turns, usage.own_tokens, usage.total_tokens, usage.tool_calls) == (4, 200, 200, 3)
    # The relay output is the call's result, read by the model's next turn.
    third = stage.model.sent("worker")[2]
    assert [m.content for m in third.messages if m.role == "tool"] == ["counter ok #1", "approved"]
    assert runtime.inspect(WORKER).state is HandleState.IDLE


async def test_a_retried_resume_returns_the_same_result_and_runs_nothing_again(stage: Stage) -> None:
    runtime, pending = await suspended_on_approve(stage)
    request = pending_of(pending)
    answer = Answer(id=request.id, ok=True, outputs=outputs_for(request, "approved"))
    done = await stage.resumed(runtime, answer)
    again = await stage.resumed(runtime, answer)
    assert again == done
    assert (stage.tools.count("counter"), stage.model.calls["worker"]) == (2, 4)
    assert await stage.settled(runtime, WORKER) == done


async def test_the_same_request_answered_differently_is_refused_and_changes_nothing(stage: Stage) -> None:
    runtime, pending = await suspended_on_approve(stage)
    request = pending_of(pending)
    await stage.answer(runtime, request, outputs=outputs_for(request, "approved"))
    before = await unchanged(stage, runtime)
    with pytest.raises(FailedPrecondition) as refused:
        await stage.resumed(runtime, Answer(id=request.id, ok=False, reason="changed my mind"))
    assert refused.value.reason == "ALREADY_ANSWERED"
    assert await unchanged(stage, runtime) == before
    assert (stage.tools.count("counter"), stage.model.calls["worker"]) == (2, 4)


async def test_an_answer_to_no_live_request_is_refused_and_changes_nothing(stage: Stage) -> None:
    runtime, pending = await suspended_on_approve(stage)
    before = await unchanged(stage, runtime)
    with pytest.raises(FailedPrecondition) as refused:
        await stage.resumed(runtime, Answer(id="not-the-request", ok=True))
    assert refused.value.reason == "NO_SUCH_REQUEST" and "'not-the-request'" in str(refused.value)
    assert await unchanged(stage, runtime) == before
    assert await stage.settled(runtime, WORKER) == pending


def _bad_answers(request_id: str, call_id: str) -> dict[str, tuple[Answer, str]]:
    """Answers a relay Request refuses, each with the field it names."""
    return {
        "an output for a call it does not have": (
            Answer(id=request_id, ok=True, outputs=(ToolOutput("call_9_9", "?"),)),
            "answer.outputs[0].call_id",
        ),
        "one call answered twice": (
            Answer(id=request_id, ok=True, outputs=(ToolOutput(call_id, "a"), ToolOutput(call_id, "b"))),
            "answer.outputs[1].call_id",
        ),
        "ok false with outputs": (Answer(id=request_id, ok=False, outputs=(ToolOutput(call_id, "a"),)), "answer.outputs"),
        "an output past the text limit": (
            Answer(id=request_id, ok=True, outputs=(ToolOutput(call_id, "x" * 300_000),)),
            "answer.outputs[0].output",
        ),
        "a reason past the text limit": (Answer(id=request_id, ok=True, reason="x" * 300_000), "answer.reason"),
    }


@pytest.mark.parametrize("case", list(_bad_answers("", "")))
async def test_an_answer_the_request_cannot_take_is_refused_naming_its_field_and_changes_nothing(stage: Stage, case: str) -> None:
    runtime, pending = await suspended_on_approve(stage)
    request = pending_of(pending)
    answer, field = _bad_answers(request.id, request.calls[0][0].id)[case]
    before = await unchanged(stage, runtime)
    with pytest.raises(InvalidArgument) as refused:
        await stage.resumed(runtime, answer)
    assert [violation.field for violation in refused.value.violations] == [field]
    assert await unchanged(stage, runtime) == before
    assert stage.model.calls["worker"] == 2
    # The Request is still live: the right answer is taken after the wrong one.
    done = await stage.answer(runtime, request, outputs=outputs_for(request, "approved"))
    assert done.status is Status.DONE


async def test_an_answer_leaving_a_relay_call_out_gives_that_call_an_explicit_error(stage: Stage) -> None:
    asker = agent(
        "asker", reply(calls=(("fetch", {"n": 1}), ("fetch", {"n": 2}))), reply("both read"), tools=(relay_tool("fetch"),)
    )
    runtime = await stage.create(asker)
    request = pending_of(await stage.run(runtime, "asker", "go"))
    first, second = (call for call, _ in request.calls)
    assert [json.loads(call.arguments_json)["n"] for call in (first, second)] == [1, 2]
    done = await stage.answer(runtime, request, outputs=(ToolOutput(second.id, "two"),))
    assert done.status is Status.DONE
    assert tool_messages(runtime, "root/asker.1") == [("the host returned no output for this call", True), ("two", False)]


async def test_a_declined_relay_request_gives_every_call_a_declined_error(stage: Stage) -> None:
    asker = agent("asker", reply(calls=(("fetch", {}), ("fetch", {}))), reply("none read"), tools=(relay_tool("fetch"),))
    runtime = await stage.create(asker)
    request = pending_of(await stage.run(runtime, "asker", "go"))
    done = await stage.resumed(runtime, Answer(id=request.id, ok=False, reason="no network"))
    assert (done.status, done.usage.tool_calls) == (Status.DONE, 2)
    assert tool_messages(runtime, "root/asker.1") == [("declined by the host: no network", True)] * 2


async def test_an_http_call_beside_relay_calls_runs_now_and_not_again_on_resume(stage: Stage) -> None:
    mixed = agent(
        "mixed",
        reply(calls=(("fetch", {"n": 1}), ("lookup", {}), ("fetch", {"n": 2}))),
        reply("merged"),
        tools=(relay_tool("fetch"), http_tool("lookup")),
    )
    runtime = await stage.create(mixed)
    request = pending_of(await stage.run(runtime, "mixed", "go"))
    # Every relay call of the turn in one Request, in order; the http call ran already.
    assert [json.loads(call.arguments_json)["n"] for call, _ in request.calls] == [1, 2]
    assert stage.tools.count("lookup") == 1
    done = await stage.answer(runtime, request, outputs=outputs_for(request, "one", "two"))
    assert (done.status, stage.tools.count("lookup"), stage.model.calls["mixed"]) == (Status.DONE, 1, 2)
    assert [content for content, _ in tool_messages(runtime, "root/mixed.1")] == ["one", "lookup ok #1", "two"]


# ---- approvals --------------------------------------------------------------------------------


def committer() -> Any:
    return agent(
        "committer",
        reply(calls=(("commit", {"to": "prod"}),), tokens=50),
        reply("reported", tokens=50),
        tools=(gated_tool("commit", "Commit to production?"),),
    )


async def test_an_approved_call_runs_once_after_yes(stage: Stage) -> None:
    runtime = await stage.create(committer())
    pending = await stage.run(runtime, "committer", "ship it")
    request = pending_of(pending)
    assert (request.kind, request.prompt) == ("approval", 'Commit to production? (commit {"to": "prod"})')
    assert stage.tools.count("commit") == 0  # asked before it runs
    done = await stage.answer(runtime, request)
    assert (done.status, done.text) == (Status.DONE, "reported")
    assert tool_messages(runtime, "root/committer.1") == [("commit ok #1", False)]
    assert await stage.answer(runtime, request) == done  # a retried approval runs nothing again
    assert (stage.tools.count("commit"), stage.model.calls["committer"]) == (1, 2)


async def test_a_denied_call_never_runs_and_the_model_reads_a_declined_error(stage: Stage) -> None:
    runtime = await stage.create(committer())
    request = pending_of(await stage.run(runtime, "committer", "ship it"))
    done = await stage.resumed(runtime, Answer(id=request.id, ok=False, reason="change freeze"))
    assert done.status is Status.DONE  # the run goes on: the model judges the refusal
    assert tool_messages(runtime, "root/committer.1") == [("declined by the host: change freeze", True)]
    assert stage.tools.count("commit") == 0
    last = stage.model.sent("committer")[-1].messages[-1]
    assert (last.role, last.content, last.is_error) == ("tool", "declined by the host: change freeze", True)


async def test_a_require_approval_guardrail_asks_with_its_reason(stage: Stage) -> None:
    rail = Guardrail(tool="drop", action=GuardrailAction.REQUIRE_APPROVAL, reason="dropping needs a human")
    runtime = await stage.create(
        agent("op", reply(calls=(("drop", {}),)), reply("dropped"), tools=(http_tool("drop"),), guardrails=(rail,))
    )
    request = pending_of(await stage.run(runtime, "op", "go"))
    assert request.kind == "approval" and request.prompt.startswith("dropping needs a human")
    assert stage.tools.count("drop") == 0
    await stage.answer(runtime, request)
    assert stage.tools.count("drop") == 1


async def test_an_approval_takes_no_tool_outputs(stage: Stage) -> None:
    runtime = await stage.create(committer())
    request = pending_of(await stage.run(runtime, "committer", "ship it"))
    before = await unchanged(stage, runtime)
    with pytest.raises(InvalidArgument) as refused:
        await stage.answer(runtime, request, outputs=(ToolOutput(request.calls[0][0].id, "done"),))
    assert [violation.field for violation in refused.value.violations] == ["answer.outputs"]
    assert await unchanged(stage, runtime) == before and stage.tools.count("commit") == 0


async def test_a_relay_call_behind_an_approval_asks_twice_with_a_request_each(stage: Stage) -> None:
    ops = agent("ops", reply(calls=(("deploy", {}),)), reply("shipped"), tools=(relay_tool("deploy", approval_required=True),))
    runtime = await stage.create(ops)
    approval = pending_of(await stage.run(runtime, "ops", "ship"))
    assert approval.kind == "approval"
    relay = await stage.answer(runtime, approval)
    relay_request = pending_of(relay)
    assert relay_request.kind == "tool_call" and relay_request.id != approval.id
    assert await stage.answer(runtime, approval) == relay  # the retried approval answers nothing else
    done = await stage.answer(runtime, relay_request, outputs=outputs_for(relay_request, "deployed"))
    assert (done.status, done.text, done.usage.tool_calls, stage.model.calls["ops"]) == (Status.DONE, "shipped", 1, 2)


# ---- the ask tool -----------------------------------------------------------------------------


async def test_the_ask_tool_suspends_for_input_and_the_answer_data_is_its_result(stage: Stage) -> None:
    runtime = await stage.create(agent("curious", reply(calls=(("ask", {"question": "Which region?"}),)), reply("deploying")))
    request = pending_of(await stage.run(runtime, "curious", "deploy"))
    assert (request.kind, request.prompt, request.path) == ("input", "Which region?", ("root", "curious.1"))
    done = await stage.answer(runtime, request, data={"region": "eu-west"})
    assert done.status is Status.DONE
    assert tool_messages(runtime, "root/curious.1") == [('{"region": "eu-west"}', False)]
    assert stage.model.calls["curious"] == 2


async def test_an_unanswered_question_tells_the_model_so(stage: Stage) -> None:
    runtime = await stage.create(agent("curious", reply(calls=(("ask", {"question": "Which region?"}),)), reply("guessing")))
    request = pending_of(await stage.run(runtime, "curious", "deploy"))
    await stage.resumed(runtime, Answer(id=request.id, ok=False, reason="nobody knows"))
    assert tool_messages(runtime, "root/curious.1") == [("the host did not answer: nobody knows", True)]


# ---- a tool's own Request, and its expiry -----------------------------------------------------


def signs_in(stage: Stage, expires_in: float) -> None:
    """crm_login answers HTTP 202 (an authorization Request expiring `expires_in` seconds from
    now) until it is called again with the host's answer, then says who signed in."""

    def body(arguments: dict[str, Any]) -> str | ToolSuspension:
        answer = stage.tools.answers[-1]
        if answer is None:
            return ToolSuspension(
                kind="authorization",
                prompt="sign in",
                url="https://crm.example/login",
                expires_at=stage.clock.time() + expires_in,
            )
        return f"signed in with {answer.data['code']}"

    stage.tools.bodies["crm_login"] = body


def crm() -> Any:
    return agent("crm", reply(calls=(("crm_login", {}),)), reply("logged in"), tools=(http_tool("crm_login"),))


async def test_a_tools_request_answered_in_time_calls_the_tool_again_with_the_answer(stage: Stage) -> None:
    signs_in(stage, expires_in=60)
    runtime = await stage.create(crm())
    request = pending_of(await stage.run(runtime, "crm", "log in"))
    assert (request.kind, request.url, request.expires_at) == (
        "authorization",
        "https://crm.example/login",
        stage.clock.time() + 60,
    )
    await stage.clock.advance(30)
    done = await stage.answer(runtime, request, data={"code": "1234"})
    assert done.status is Status.DONE
    assert tool_messages(runtime, "root/crm.1") == [("signed in with 1234", False)]
    assert stage.tools.count("crm_login") == 2 and stage.tools.keys("crm_login")[0] == stage.tools.keys("crm_login")[1]


async def test_an_unanswered_tools_request_lapses_into_an_error_result_when_the_clock_passes_it(stage: Stage) -> None:
    signs_in(stage, expires_in=60)
    runtime = await stage.create(crm())
    request = pending_of(await stage.run(runtime, "crm", "log in"))
    await stage.clock.advance(59)
    assert runtime.inspect("root/crm.1").state is HandleState.SUSPENDED
    await stage.clock.advance(1)
    assert runtime.inspect("root/crm.1").state is HandleState.IDLE
    done = await stage.settled(runtime, "root/crm.1")
    assert (done.status, done.text) == (Status.DONE, "logged in")
    [(content, is_error)] = tool_messages(runtime, "root/crm.1")
    assert is_error and content == "the pending authorization request expired at 2027-01-15T08:01:00+00:00"
    assert stage.tools.count("crm_login") == 1  # nobody answered: the tool is not called again
    with pytest.raises(FailedPrecondition):
        await stage.answer(runtime, request, data={"code": "late"})
    assert stage.tools.count("crm_login") == 1
