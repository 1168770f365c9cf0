"""What a caller defines, refused by the runtime service before anything is made
(domain/definitions/validation.py through RuntimeService.create_runtime): names, teams and
the cycles delegation could make, tools, budgets, schemas, scripts, heartbeats, guardrails.
Every refusal is InvalidArgument with a violation per field, a description a user can act on
(a secret never quoted), and no runtime in the store or in memory."""

from __future__ import annotations

from typing import Any

import pytest
from agentruntime_server.domain.billing.usage import Tokens
from agentruntime_server.domain.errors import FieldViolation, InvalidArgument
from agentruntime_server.domain.vocabulary import (
    AgentSpec,
    Budget,
    Compaction,
    CompletionGate,
    Guardrail,
    GuardrailAction,
    Heartbeat,
    HttpExecutor,
    McpServerSpec,
    RuntimeOptions,
    ScriptedReply,
    ScriptedToolCall,
    ToolSpec,
    WorkerExecutor,
)

from tests.domain.harness import Bench

SECRET = "s3cret-t0ken"
LONG_TEXT = "x" * (16 * 1024 + 1)  # past MAX_DESCRIPTION_BYTES


def tool(name: str = "lookup", schema: dict[str, Any] | None = None) -> ToolSpec:
    return ToolSpec(name, f"the {name} tool", schema or {"type": "object"}, HttpExecutor("https://tools.example/t"))


def http(executor: HttpExecutor) -> ToolSpec:
    return ToolSpec("lookup", "the lookup tool", {"type": "object"}, executor)


def scripted(*replies: ScriptedReply, name: str = "solo") -> AgentSpec:
    return AgentSpec(name, script=replies or (ScriptedReply("hi"),))


def called(name: str, arguments: str = "{}") -> ScriptedReply:
    return ScriptedReply("", tool_calls=(ScriptedToolCall(name, arguments),))


def rail(on: str, reason: str = "no") -> Guardrail:
    return Guardrail(on, GuardrailAction.DENY, reason)


async def refused(bench: Bench, *agents: AgentSpec, runtime_id: str = "rt", **more: Any) -> dict[str, str]:
    """The violations a CreateRuntime of the agents gets, by field; and it made nothing."""
    with pytest.raises(InvalidArgument) as raised:
        await bench.service.create_runtime(runtime_id, agents, **more)
    assert raised.value.reason == ""
    violations = raised.value.violations
    assert violations and all(isinstance(violation, FieldViolation) for violation in violations)
    assert await bench.store.count_runtimes(bench.tenant) == 0 and not bench.service.cache.runtimes
    if runtime_id:
        assert not await bench.store.runtime_exists(runtime_id)
    return {violation.field: violation.description for violation in violations}


# Each: the agents, and the one violation they get (its field, and what its description says).
CASES: dict[str, tuple[tuple[AgentSpec, ...], str, str]] = {
    # ---- names
    "no agents": ((), "agents", "define at least one agent"),
    "too many agents": (
        tuple(scripted(name=f"a{n}") for n in range(101)),
        "agents",
        "define at most 100 agents",
    ),
    "an agent name that starts with a digit": (
        (AgentSpec("9lives"),),
        "agents[0].name",
        "not a valid agent name: use 1-64 letters",
    ),
    "an agent name of 65 characters": ((AgentSpec("a" * 65),), "agents[0].name", "not a valid agent name"),
    "an agent name with a space": ((AgentSpec("the lead"),), "agents[0].name", "not a valid agent name"),
    "two agents of one name": ((AgentSpec("lead"), AgentSpec("lead")), "agents[1].name", "duplicate agent name 'lead'"),
    # ---- teams, judges, summarizers and the cycles they could make
    "a team mate not defined": (
        (AgentSpec("lead", team=("ghost",)),),
        "agents[0].team[0]",
        "unknown agent 'ghost'; define it in the same runtime",
    ),
    "a team naming a mate twice": (
        (AgentSpec("lead", team=("w", "w")), AgentSpec("w")),
        "agents[0].team",
        "names an agent more than once",
    ),
    "an agent on its own team": (
        (AgentSpec("a", team=("a",)),),
        "agents[0].team",
        "delegation leads back to 'a' (a -> a)",
    ),
    "a cycle of three": (
        (AgentSpec("a", team=("b",)), AgentSpec("b", team=("c",)), AgentSpec("c", team=("a",))),
        "agents[0].team",
        "(a -> b -> c -> a); teams and judges must not form a cycle",
    ),
    "a cycle through a judge": (
        (AgentSpec("writer", completion=CompletionGate(judge_agent="judge")), AgentSpec("judge", team=("writer",))),
        "agents[0].team",
        "(writer -> judge -> writer)",
    ),
    "a cycle through a summarizer": (
        (
            AgentSpec("a", compaction=Compaction(max_context_tokens=1000, summarizer_agent="s")),
            AgentSpec("s", team=("a",)),
        ),
        "agents[0].team",
        "(a -> s -> a)",
    ),
    "a judge not defined": (
        (AgentSpec("writer", completion=CompletionGate(judge_agent="nobody")),),
        "agents[0].completion.judge_agent",
        "unknown agent 'nobody'",
    ),
    "a summarizer not defined": (
        (AgentSpec("a", compaction=Compaction(max_context_tokens=1000, summarizer_agent="nobody")),),
        "agents[0].compaction.summarizer_agent",
        "unknown agent 'nobody'",
    ),
    # ---- tools
    "a tool named as a built-in": ((AgentSpec("a", tools=(tool("task"),)),), "agents[0].tools[0].name", "is a built-in tool"),
    "a tool name with a space": (
        (AgentSpec("a", tools=(tool("look up"),)),),
        "agents[0].tools[0].name",
        "not a valid tool name",
    ),
    "two tools of one name": (
        (AgentSpec("a", tools=(tool(), tool())),),
        "agents[0].tools[1].name",
        "duplicate tool name 'lookup' in agent 'a'",
    ),
    "129 tools": (
        (AgentSpec("a", tools=tuple(tool(f"t{n}") for n in range(129))),),
        "agents[0].tools",
        "has 129 tools; the limit is 128",
    ),
    "an input schema that is not one": (
        (AgentSpec("a", tools=(tool(schema={"type": "object", "properties": {"n": {"type": "integr"}}}),)),),
        "agents[0].tools[0].input_schema",
        "not a valid JSON Schema",
    ),
    "a tool url that is not http": (
        (AgentSpec("a", tools=(http(HttpExecutor("ftp://tools.example/x")),)),),
        "agents[0].tools[0].http.url",
        "is not an absolute http(s) URL",
    ),
    "a tool url with credentials": (
        (AgentSpec("a", tools=(http(HttpExecutor(f"https://bot:{SECRET}@tools.example/x")),)),),
        "agents[0].tools[0].http.url",
        "must not carry credentials (user:password@); send them in a header",
    ),
    "a tool timeout of zero": (
        (AgentSpec("a", tools=(http(HttpExecutor("https://tools.example/x", timeout=0)),)),),
        "agents[0].tools[0].http.timeout",
        "must be a positive duration of at most 600s",
    ),
    "a header the runtime sets": (
        (AgentSpec("a", tools=(http(HttpExecutor("https://tools.example/x", {"Idempotency-Key": SECRET})),)),),
        "agents[0].tools[0].http.headers['Idempotency-Key']",
        "is set by the runtime itself; remove it",
    ),
    "a header value that would split the request": (
        (AgentSpec("a", tools=(http(HttpExecutor("https://tools.example/x", {"Authorization": f"{SECRET}\r\nX: y"})),)),),
        "agents[0].tools[0].http.headers['Authorization']",
        "the value must be visible ASCII, spaces and tabs: no CR, LF or NUL",
    ),
    "a worker queue that is no name": (
        (AgentSpec("a", tools=(ToolSpec("w", "w", {}, WorkerExecutor("two words")),)),),
        "agents[0].tools[0].worker.queue",
        "is not a queue name",
    ),
    "an mcp server that is no name": (
        (AgentSpec("a", mcp_servers=(McpServerSpec("has space", "https://mcp.example/"),)),),
        "agents[0].mcp_servers[0].name",
        "is not a server name",
    ),
    # ---- budgets
    "a negative budget": ((AgentSpec("a", budget=Budget(max_turns=-1)),), "agents[0].budget.max_turns", "must be >= 0 (got -1)"),
    "a negative cost budget": (
        (AgentSpec("a", budget=Budget(max_cost=-5)),),
        "agents[0].budget.max_cost",
        "must be >= 0 (got -5)",
    ),
    "no concurrency at all": (
        (AgentSpec("a", budget=Budget(max_concurrent=0)),),
        "agents[0].budget.max_concurrent",
        "must be >= 1 (got 0)",
    ),
    "a wall time of zero": (
        (AgentSpec("a", budget=Budget(max_wall_time=0)),),
        "agents[0].budget.max_wall_time",
        "must be a positive duration",
    ),
    "a wall time past 30 days": (
        (AgentSpec("a", budget=Budget(max_wall_time=31 * 86400)),),
        "agents[0].budget.max_wall_time",
        "must be at most 30 days",
    ),
    # ---- schemas of answers
    "an output schema whose top is a list": (
        (AgentSpec("a", output_schema={"type": "array"}),),
        "agents[0].output_schema",
        'must have "type": "object" at the top',
    ),
    "an output schema that is not one": (
        (AgentSpec("a", output_schema={"type": "object", "required": "n"}),),
        "agents[0].output_schema",
        "not a valid JSON Schema",
    ),
    # ---- scripts
    "a scripted call to a tool the agent lacks": (
        (scripted(called("lookup")),),
        "agents[0].script.replies[0].tool_calls[0].name",
        "agent 'solo' has no tool 'lookup'",
    ),
    "scripted arguments that are not JSON": (
        (scripted(called("ask", "{nope")),),
        "agents[0].script.replies[0].tool_calls[0].arguments_json",
        "not valid JSON",
    ),
    "scripted arguments that are not an object": (
        (scripted(called("ask", "[1, 2]")),),
        "agents[0].script.replies[0].tool_calls[0].arguments_json",
        "must be a JSON object",
    ),
    "a scripted delay past ten minutes": (
        (scripted(ScriptedReply("late", delay=601)),),
        "agents[0].script.replies[0].delay",
        "must be between 0 and 600s",
    ),
    "negative scripted tokens": (
        (scripted(ScriptedReply("hi", tokens=-1)),),
        "agents[0].script.replies[0].tokens",
        "must be between 0 and 100,000,000",
    ),
    "scripted reasoning past its output": (
        (scripted(ScriptedReply("hi", usage=Tokens(output=5, reasoning=6))),),
        "agents[0].script.replies[0].usage.reasoning_tokens",
        "must be at most output_tokens",
    ),
    "scripted tokens that are not the usage's sum": (
        (scripted(ScriptedReply("hi", tokens=7, usage=Tokens(input=2, output=3))),),
        "agents[0].script.replies[0].tokens",
        "must be 0 or the usage's sum (5) when usage is set",
    ),
    # ---- heartbeats
    "a heartbeat of half a second": (
        (AgentSpec("a", heartbeat=Heartbeat(every=0.5)),),
        "agents[0].heartbeat.every",
        "must be between 1s and 30 days",
    ),
    "a heartbeat of 31 days": (
        (AgentSpec("a", heartbeat=Heartbeat(every=31 * 86400)),),
        "agents[0].heartbeat.every",
        "must be between 1s and 30 days",
    ),
    "a heartbeat prompt past 16 KiB": (
        (AgentSpec("a", heartbeat=Heartbeat(every=60, prompt=LONG_TEXT)),),
        "agents[0].heartbeat.prompt",
        "is longer than 16384 bytes",
    ),
    # ---- guardrails and completion gates
    "a guardrail on a tool the agent lacks": (
        (AgentSpec("a", guardrails=(rail("delete_all"),)),),
        "agents[0].guardrails[0].tool",
        "agent 'a' has no tool 'delete_all'",
    ),
    "a guardrail on task without a team": (
        (AgentSpec("a", guardrails=(rail("task"),)),),
        "agents[0].guardrails[0].tool",
        "agent 'a' has no tool 'task'",
    ),
    "a guardrail reason past 16 KiB": (
        (AgentSpec("a", tools=(tool(),), guardrails=(rail("lookup", LONG_TEXT),)),),
        "agents[0].guardrails[0].reason",
        "is longer than 16384 bytes",
    ),
    "a completion pattern that does not compile": (
        (AgentSpec("a", completion=CompletionGate(must_match="(unclosed")),),
        "agents[0].completion.must_match",
        "invalid regular expression",
    ),
    "negative completion attempts": (
        (AgentSpec("a", completion=CompletionGate(max_attempts=-1)),),
        "agents[0].completion.max_attempts",
        "must be >= 0 (0 means 1)",
    ),
    # ---- the rest of an agent
    "an output cap of zero": (
        (AgentSpec("a", max_output_tokens=0),),
        "agents[0].max_output_tokens",
        "must be between 1 and 10,000,000 (or unset)",
    ),
    "instructions past 256 KiB": (
        (AgentSpec("a", instructions="x" * (256 * 1024 + 1)),),
        "agents[0].instructions",
        "has 262145 bytes; the limit is 262144",
    ),
    "a model name with a control character": (
        (AgentSpec("a", model="gpt\n4"),),
        "agents[0].model",
        "must not contain control characters",
    ),
    "a provider the server does not have": (
        (AgentSpec("a", provider="elsewhere"),),
        "agents[0].provider",
        "unknown provider 'elsewhere'; this server has ['scripted']",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_definition_is_refused_by_its_field_and_creates_nothing(bench: Bench, case: str) -> None:
    agents, field, says = CASES[case]
    found = await refused(bench, *agents)
    assert list(found) == [field], found
    assert says in found[field], found[field]
    assert SECRET not in found[field]  # a credential or a header's value is never quoted


async def test_every_problem_of_a_definition_is_named_in_one_refusal(bench: Bench) -> None:
    found = await refused(
        bench,
        AgentSpec("lead", team=("w", "ghost"), budget=Budget(max_tokens=-1), heartbeat=Heartbeat(every=0)),
        AgentSpec("w", tools=(tool("task"),), guardrails=(rail("nothing"),)),
        AgentSpec("w"),
        found=[FieldViolation("agents[2].description", "not valid UTF-8")],  # what the edge found decoding
    )
    assert sorted(found) == [
        "agents[0].budget.max_tokens",
        "agents[0].heartbeat.every",
        "agents[0].team[1]",
        "agents[1].guardrails[0].tool",
        "agents[1].tools[0].name",
        "agents[2].description",
        "agents[2].name",
    ]


@pytest.mark.parametrize("runtime_id", ["has space", "-starts-with-a-dash", "x" * 65, "acme:rt", "ünï"])
async def test_a_runtime_id_that_is_no_plain_slug_is_refused(bench: Bench, runtime_id: str) -> None:
    found = await refused(bench, scripted(), runtime_id=runtime_id)
    assert list(found) == ["runtime_id"] and "is not a plain slug" in found["runtime_id"]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (RuntimeOptions(inbox_capacity=101), "options.inbox_capacity"),  # the server's is 100
        (RuntimeOptions(inbox_capacity=-1), "options.inbox_capacity"),
        (RuntimeOptions(max_concurrent_model_calls=65), "options.max_concurrent_model_calls"),  # the server's is 64
    ],
)
async def test_a_runtimes_own_settings_stay_within_the_servers(bench: Bench, options: RuntimeOptions, field: str) -> None:
    found = await refused(bench, scripted(), options=options)
    assert list(found) == [field] and "must be between 0" in found[field]


async def test_what_the_rules_allow_is_created(bench: Bench) -> None:
    """The edges of what is refused above, taken: a chain of delegation with a judge and a
    summarizer, budgets of zero, a heartbeat of a second, guardrails on the built-ins."""
    agents = (
        AgentSpec(
            "lead",
            team=("mid",),
            completion=CompletionGate(judge_agent="judge", must_match="^done", max_attempts=0),
            compaction=Compaction(max_context_tokens=1, summarizer_agent="judge"),
            guardrails=(rail("task"), rail("ask")),
            budget=Budget(max_turns=0, max_tokens=0, max_children=0, max_wall_time=30 * 86400),
            heartbeat=Heartbeat(every=1),
            max_output_tokens=1,
        ),
        AgentSpec("mid", team=("leaf",), tools=(tool("a" * 64),)),
        AgentSpec("leaf", script=(called("ask", '{"q": 1}'), ScriptedReply("hi", delay=600, usage=Tokens(output=3)))),
        AgentSpec("judge"),
    )
    created = await bench.service.create_runtime("A.b_c-1", agents)
    assert created == "A.b_c-1" and await bench.store.count_runtimes(bench.tenant) == 1
