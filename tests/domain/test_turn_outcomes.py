"""How a turn ends, through the runtime service in-process (tests/domain/harness.py): an answer,
tool calls whose results the transcript pairs with them, calls running at once, calls refused
as error results (an unknown tool, arguments that are not JSON, not an object or not what the
schema asks), guardrails that deny or ask the host, a model that fails, a reply cut off at its
output cap, a refusal, and runs stopped before they took a step."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from agentruntime_server.domain.vocabulary import (
    Answer,
    FailureReason,
    Guardrail,
    GuardrailAction,
    HandleState,
    Limit,
    RelayExecutor,
    ReplyStop,
    Status,
    ToolOutput,
    ToolResult,
    ToolSpec,
)

from tests.domain.harness import Bench, agent, http_tool, reply
from tests.domain.kit_turns import NEVER_HANGS, Benches, child_of

pytestmark = NEVER_HANGS

PING = http_tool("ping", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})


async def test_an_answer_is_the_prompt_then_the_reply_in_the_transcript(bench: Bench) -> None:
    runtime = await bench.create(agent("solo", reply("the answer", tokens=4), instructions="Be brief."))
    result = await bench.run(runtime, "solo", "the question")
    transcript = runtime.transcript(result.handle_id)
    assert [(m.role, m.content, m.turn) for m in transcript] == [("user", "the question", 0), ("assistant", "the answer", 1)]
    assert (result.status, result.limit, result.failure, result.is_error) == (Status.DONE, Limit.NONE, None, False)
    assert runtime.handle(result.handle_id).state is HandleState.IDLE


async def test_each_tool_result_follows_its_call_paired_by_id_and_the_model_reads_them(bench: Bench) -> None:
    bench.tools.bodies["ping"] = lambda arguments: f"pong {arguments['n']}"
    worker = agent("worker", reply(calls=(("ping", {"n": 1}), ("ping", {"n": 2}))), reply("read both"), tools=(PING,))
    runtime = await bench.create(worker)
    result = await bench.run(runtime, "worker", "ping twice")
    user, made, first, second, answer = runtime.transcript(result.handle_id)
    assert (user.role, made.role, answer.role, answer.content) == ("user", "assistant", "assistant", "read both")
    assert [call.id for call in made.tool_calls] == ["call_1_1", "call_1_2"]
    assert [(m.role, m.tool_call_id, m.content, m.is_error) for m in (first, second)] == [
        ("tool", "call_1_1", "pong 1", False),
        ("tool", "call_1_2", "pong 2", False),
    ]
    # Each call once, keyed by the runtime, the handle and the call: a rerun would reuse its key.
    assert [key for _, _, key in bench.tools.calls] == [f"{runtime.key}/{result.handle_id}/call_1_{n}" for n in (1, 2)]
    assert (result.usage.turns, result.usage.tool_calls) == (2, 2)


async def test_a_tools_error_result_reaches_the_model_as_an_error(bench: Bench) -> None:
    bench.tools.bodies["ping"] = lambda arguments: ToolResult("the service is down", is_error=True)
    runtime = await bench.create(agent("worker", reply(calls=(("ping", {"n": 1}),)), reply("noted"), tools=(PING,)))
    result = await bench.run(runtime, "worker", "ping")
    [tool] = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert (tool.content, tool.is_error, result.status, result.text) == ("the service is down", True, Status.DONE, "noted")


async def test_the_calls_of_one_reply_run_at_once(bench: Bench) -> None:
    """Two task calls in one reply: each child's reply takes 10 s, and both are in by 10 s."""
    lead = agent(
        "lead",
        reply(calls=(("task", {"agent": "slow", "prompt": "a"}), ("task", {"agent": "slow", "prompt": "b"}))),
        reply("both back"),
        team=("slow",),
    )
    runtime = await bench.create(lead, agent("slow", reply("done", delay=10)))
    handle_id = await bench.spawn(runtime, "lead")
    await runtime.wake(handle_id, "go")
    waiting = asyncio.ensure_future(runtime.wait(handle_id, None))
    await bench.clock.advance(9.5)
    children = runtime.handle(handle_id).children
    assert [child.state for child in children] == [HandleState.RUNNING] * 2  # both started, neither done
    await bench.clock.advance(0.5)
    assert waiting.done() and (await waiting).text == "both back"


async def test_a_call_to_an_unknown_tool_is_an_error_result_naming_the_tools(benches: Benches) -> None:
    """A script may only call its agent's tools (CreateRuntime checks it): a provider's model may call anything."""
    bench, model = await benches.planned()
    model.plan("worker", reply(calls=(("nope", {}),)), reply("sorry"))
    runtime = await bench.create(agent("worker", tools=(PING,)))
    result = await bench.run(runtime, "worker", "go")
    [tool] = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert tool.is_error and tool.content == "unknown tool 'nope'; available tools: ['ask', 'ping']"
    assert (result.status, result.text, result.usage.tool_calls) == (Status.DONE, "sorry", 1)
    assert bench.tools.calls == []


async def test_arguments_a_tool_would_refuse_are_error_results_and_the_tool_is_never_called(benches: Benches) -> None:
    bench, model = await benches.planned()
    refused: tuple[tuple[str, dict[str, Any] | str], ...] = (
        ("ping", "{not json"),
        ("ping", "[1, 2]"),
        ("ping", {"n": "one"}),
        ("ping", {}),
    )
    model.plan("worker", reply(calls=refused), reply("fixed"))
    runtime = await bench.create(agent("worker", tools=(PING,)))
    result = await bench.run(runtime, "worker", "go")
    tools = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert all(m.is_error for m in tools)
    assert tools[0].content.startswith("the arguments are not valid JSON: ")
    assert tools[1].content == "the arguments must be a JSON object"
    assert tools[2].content.startswith("the arguments do not match the tool's schema: ") and "'one'" in tools[2].content
    assert tools[3].content.startswith("the arguments do not match the tool's schema: ") and "'n'" in tools[3].content
    assert bench.tools.calls == [] and (result.status, result.usage.tool_calls) == (Status.DONE, 4)


async def test_a_guardrail_that_denies_answers_the_call_with_its_reason(bench: Bench) -> None:
    deny = Guardrail("ping", GuardrailAction.DENY, "no pinging production")
    worker = agent("worker", reply(calls=(("ping", {"n": 1}),)), reply("ok"), tools=(PING,), guardrails=(deny,))
    runtime = await bench.create(worker)
    result = await bench.run(runtime, "worker", "go")
    [tool] = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert (tool.content, tool.is_error) == ("denied by guardrail: no pinging production", True)
    assert bench.tools.calls == [] and result.status is Status.DONE


async def test_a_guardrail_that_requires_approval_asks_the_host_and_runs_once_approved(bench: Bench) -> None:
    rail = Guardrail("ping", GuardrailAction.REQUIRE_APPROVAL, "Ping production?")
    worker = agent("worker", reply(calls=(("ping", {"n": 7}),)), reply("pinged"), tools=(PING,), guardrails=(rail,))
    runtime = await bench.create(worker)
    pending = await bench.run(runtime, "worker", "go")
    request = pending.pending
    assert request is not None and pending.status is Status.PENDING
    assert (request.kind, request.prompt) == ("approval", 'Ping production? (ping {"n": 7})')
    assert runtime.handle(pending.handle_id).state is HandleState.SUSPENDED and bench.tools.calls == []
    done = await bench.resume(runtime, pending)
    assert (done.status, done.text, bench.tools.count("ping")) == (Status.DONE, "pinged", 1)


async def test_an_approval_declined_is_an_error_result_and_the_tool_never_runs(bench: Bench) -> None:
    guarded = dataclasses.replace(PING, approval_required=True, approval_prompt="Really?")
    runtime = await bench.create(agent("worker", reply(calls=(("ping", {"n": 1}),)), reply("fine"), tools=(guarded,)))
    pending = await bench.run(runtime, "worker", "go")
    assert pending.pending is not None and pending.pending.prompt.startswith("Really? ")
    done = await bench.resume(runtime, pending, ok=False, reason="not today")
    [tool] = [m for m in runtime.transcript(done.handle_id) if m.role == "tool"]
    assert (tool.content, tool.is_error) == ("declined by the host: not today", True)
    assert bench.tools.calls == [] and done.text == "fine"


async def test_the_ask_tool_and_a_relay_tool_take_their_results_from_the_host(bench: Bench) -> None:
    relay = ToolSpec("fetch", "the host fetches", {"type": "object"}, RelayExecutor())
    worker = agent(
        "worker",
        reply(calls=(("ask", {"question": "which region?"}),)),
        reply(calls=(("fetch", {"what": "rates"}),)),
        reply("done"),
        tools=(relay,),
    )
    runtime = await bench.create(worker)
    asked = await bench.run(runtime, "worker", "go")
    assert asked.pending is not None and (asked.pending.kind, asked.pending.prompt) == ("input", "which region?")
    relayed = await bench.resume(runtime, asked, data={"region": "eu"})
    assert relayed.pending is not None and relayed.pending.kind == "tool_call"
    [(call, _)] = relayed.pending.calls
    done = await runtime.resume(Answer(id=relayed.pending.id, ok=True, outputs=(ToolOutput(call.id, "1.08"),)))
    tools = [(m.content, m.is_error) for m in runtime.transcript(done.handle_id) if m.role == "tool"]
    assert tools == [(json.dumps({"region": "eu"}), False), ("1.08", False)]
    assert done.status is Status.DONE


async def test_a_model_that_fails_settles_error_with_its_failure_and_bills_nothing(bench: Bench) -> None:
    runtime = await bench.create(agent("solo", reply(stop=ReplyStop.PROVIDER_UNAVAILABLE), reply("back")))
    result = await bench.run(runtime, "solo", "go")
    assert (result.status, result.is_error, result.limit) == (Status.ERROR, True, Limit.NONE)
    assert result.failure is not None
    assert (result.failure.reason, result.failure.provider, result.failure.http_status, result.failure.retryable) == (
        FailureReason.PROVIDER_UNAVAILABLE,
        "scripted",
        503,
        True,
    )
    assert result.text.startswith("model call failed: ") and result.output is None
    assert (result.usage.turns, result.usage.own_tokens, result.usage.total_tokens) == (0, 0, 0)
    handle = runtime.handle(result.handle_id)
    assert handle.state is HandleState.IDLE and [m.role for m in handle.transcript] == ["user"]


async def test_a_child_whose_model_fails_is_an_error_result_for_its_parent_not_a_failure(bench: Bench) -> None:
    lead = agent("lead", reply(calls=(("task", {"agent": "w", "prompt": "dig"}),)), reply("coped"), team=("w",))
    runtime = await bench.create(lead, agent("w", reply(stop=ReplyStop.PROVIDER_UNAVAILABLE)))
    result = await bench.run(runtime, "lead", "go")
    assert (result.status, result.text, result.failure) == (Status.DONE, "coped", None)
    [tool] = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert tool.is_error and tool.content.startswith(f"[{result.handle_id}/w.1 ERROR] model call failed: ")


async def test_a_reply_cut_at_its_output_cap_stops_incomplete_and_its_calls_never_run(bench: Bench) -> None:
    cut = reply("The answer is", calls=(("ping", {"n": 1}),), stop=ReplyStop.MAX_OUTPUT_TOKENS)
    runtime = await bench.create(agent("worker", cut, reply("done"), tools=(PING,)))
    result = await bench.run(runtime, "worker", "go")
    assert (result.status, result.limit, result.text) == (Status.INCOMPLETE, Limit.MAX_OUTPUT_TOKENS, "The answer is")
    _, made, answer = runtime.transcript(result.handle_id)
    assert made.truncated and not made.refusal and [c.name for c in made.tool_calls] == ["ping"]
    # The transcript stays well formed: the call is answered, as not run.
    assert (answer.tool_call_id, answer.is_error) == (made.tool_calls[0].id, True) and answer.content.startswith("not run: ")
    assert bench.tools.calls == []
    await runtime.post(result.handle_id, "go on", "", "host")
    await runtime.wake(result.handle_id, "")
    again = await runtime.wait(result.handle_id, None)
    assert (again.status, again.text, bench.tools.calls) == (Status.DONE, "done", [])


async def test_a_refusal_is_an_error_kept_in_the_transcript_and_the_handle_goes_on(bench: Bench) -> None:
    runtime = await bench.create(agent("solo", reply("I won't do that.", stop=ReplyStop.REFUSAL), reply("fine then")))
    result = await bench.run(runtime, "solo", "do the thing")
    assert (result.status, result.is_error, result.text) == (Status.ERROR, True, "I won't do that.")
    assert result.failure is not None
    assert (result.failure.reason, result.failure.provider) == (FailureReason.MODEL_REFUSED, "scripted")
    [_, refused] = runtime.transcript(result.handle_id)
    assert refused.refusal and not refused.truncated and refused.content == "I won't do that."
    assert result.usage.turns == 1  # the refusal was a turn, and is billed
    await runtime.wake(result.handle_id, "please, it is for a test")
    again = await runtime.wait(result.handle_id, None)
    assert (again.status, again.text, again.usage.turns) == (Status.DONE, "fine then", 2)


async def test_a_child_cut_off_or_refusing_is_an_error_result_for_its_parent(bench: Bench) -> None:
    lead = agent(
        "lead",
        reply(calls=(("task", {"agent": "cut", "prompt": "a"}), ("task", {"agent": "refuser", "prompt": "b"}))),
        reply("handled"),
        team=("cut", "refuser"),
    )
    cut = agent("cut", reply("half an ans", stop=ReplyStop.MAX_OUTPUT_TOKENS))
    refuser = agent("refuser", reply("no", stop=ReplyStop.REFUSAL))
    runtime = await bench.create(lead, cut, refuser)
    result = await bench.run(runtime, "lead", "delegate")
    assert (result.status, result.text) == (Status.DONE, "handled")
    first, second = [m for m in runtime.transcript(result.handle_id) if m.role == "tool"]
    assert first.is_error and first.content == f"[{result.handle_id}/cut.1 INCOMPLETE LIMIT_MAX_OUTPUT_TOKENS] half an ans"
    assert second.is_error and second.content == f"[{result.handle_id}/refuser.1 ERROR] no"
    assert child_of(runtime, result.handle_id, "cut").last_result is not None


async def test_an_interrupt_before_the_runs_first_step_settles_it_and_it_can_run_again(bench: Bench) -> None:
    """The run's task is made by the Wake, not started: an Interrupt in the same tick must still
    settle it (a task cancelled before its first step runs none of its code)."""
    runtime = await bench.create(agent("a", reply("ran", tokens=5)))
    handle_id = await bench.spawn(runtime, "a")
    await runtime.wake(handle_id, "go")
    assert await runtime.interrupt(handle_id)
    result = await runtime.wait(handle_id, None)
    assert (result.status, result.usage.turns, result.usage.own_tokens) == (Status.INTERRUPTED, 0, 0)
    handle = runtime.handle(handle_id)
    assert handle.state is HandleState.IDLE and handle.transcript == []  # rolled back to before its prompt
    await runtime.wake(handle_id, "go")
    again = await runtime.wait(handle_id, None)
    assert (again.status, again.text, again.usage.turns) == (Status.DONE, "ran", 1)


async def test_stops_sent_together_stop_each_run_once(bench: Bench) -> None:
    runtime = await bench.create(agent("a", reply("slow", delay=5)))
    handles = [await bench.spawn(runtime, "a") for _ in range(4)]
    for handle_id in handles:
        await runtime.wake(handle_id, "go")
    await bench.clock.settle()  # every run is in its model call
    stops = []
    for handle_id in handles:
        stops += [runtime.interrupt(handle_id), runtime.close(handle_id, True), runtime.interrupt(handle_id)]
    await asyncio.gather(*stops)
    for handle_id in handles:
        result = await runtime.wait(handle_id, None)
        assert result.status in (Status.INTERRUPTED, Status.CLOSED), result
        assert runtime.handle(handle_id).state is HandleState.CLOSED and runtime.runs.get(handle_id) is None
    await bench.clock.advance(10)  # the model calls were cut: nothing of them lands later
    assert all(runtime.handle(handle_id).usage.turns == 0 for handle_id in handles)
