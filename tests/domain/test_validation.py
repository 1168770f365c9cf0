"""What a caller defines, checked in the domain alone: every problem of a set of AgentDefs is
reported at once, by field path, with what to do about it; a zero budget is a limit, not unset."""

from __future__ import annotations

import pytest
from agentruntime_server.domain.definitions import validation
from agentruntime_server.domain.errors import InvalidArgument
from agentruntime_server.domain.vocabulary import AgentSpec, Budget, CompletionGate, RelayExecutor, ToolSpec


def violations(agents: list[AgentSpec], providers: list[str] | None = None) -> dict[str, str]:
    with pytest.raises(InvalidArgument) as refused:
        validation.check_agents(agents, providers)
    return {violation.field: violation.description for violation in refused.value.violations}


def test_every_mistake_of_a_set_of_agents_is_named_at_once_by_its_field() -> None:
    found = violations(
        [
            AgentSpec("lead", team=("ghost",), budget=Budget(max_turns=-1)),
            AgentSpec("lead"),
            AgentSpec("9bad", tools=(ToolSpec("task", "mine", {}, RelayExecutor()),)),
            AgentSpec("writer", provider="elsewhere"),
        ],
        providers=["openai"],
    )
    assert found == {
        "agents[0].team[0]": "unknown agent 'ghost'; define it in the same runtime",
        "agents[0].budget.max_turns": "must be >= 0 (got -1); leave it unset for no limit",
        "agents[1].name": "duplicate agent name 'lead'",
        "agents[2].name": "'9bad' is not a valid agent name: use 1-64 letters, digits, '_' or '-', starting with a letter",
        "agents[2].tools[0].name": "'task' is a built-in tool; choose another name",
        "agents[3].provider": "unknown provider 'elsewhere'; this server has ['openai']"
        " (leave it empty for the server's default)",
    }


def test_delegation_that_leads_back_to_an_agent_is_refused_through_teams_and_judges() -> None:
    assert violations([AgentSpec("a", team=("b",)), AgentSpec("b", team=("a",))]) == {
        "agents[0].team": "delegation leads back to 'a' (a -> b -> a); teams and judges must not form a cycle"
    }
    judged = [AgentSpec("writer", completion=CompletionGate(judge_agent="judge")), AgentSpec("judge", team=("writer",))]
    assert list(violations(judged)) == ["agents[0].team"]
    validation.check_agents([AgentSpec("a", team=("b",)), AgentSpec("b", team=("c",)), AgentSpec("c")])  # a chain is fine


def test_a_budget_of_zero_is_a_limit_and_a_negative_one_is_refused() -> None:
    assert validation.check_budget(Budget(max_turns=0, max_tokens=0, max_children=0), "budget") == []
    refused = validation.check_budget(Budget(max_tool_calls=-2, max_concurrent=0, max_wall_time=0), "budget")
    assert [violation.field for violation in refused] == [
        "budget.max_tool_calls",
        "budget.max_concurrent",
        "budget.max_wall_time",
    ]


@pytest.mark.parametrize(
    ("runtime_id", "valid"), [("ok-id.1", True), ("A", True), ("bad id!", False), ("-dash", False), ("x" * 65, False)]
)
def test_a_runtime_id_is_a_plain_slug(runtime_id: str, valid: bool) -> None:
    if valid:
        validation.check_runtime_id(runtime_id)
        return
    with pytest.raises(InvalidArgument) as refused:
        validation.check_runtime_id(runtime_id)
    [violation] = refused.value.violations
    assert violation.field == "runtime_id" and "plain slug" in violation.description
