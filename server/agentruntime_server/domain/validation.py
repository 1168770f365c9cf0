"""Checks on what a caller defines: every problem found is reported at once, by field path."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from urllib.parse import urlsplit

import jsonschema
import jsonschema.exceptions

from .errors import FieldViolation, InvalidArgument
from .model import AgentSpec, Budget, HttpExecutor

RUNTIME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# Tool names become model function names: the strictest common provider rule.
TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
BUILTIN_TOOLS = ("task", "ask")


def check_runtime_id(runtime_id: str) -> None:
    if not RUNTIME_ID.match(runtime_id):
        raise InvalidArgument(
            [
                FieldViolation(
                    "runtime_id",
                    f"{runtime_id!r} is not a plain slug: use 1-64 letters, digits, '_', '-' or '.', "
                    "starting with a letter or digit (or leave it empty to have one generated)",
                )
            ]
        )


def check_agents(agents: Sequence[AgentSpec], providers: Collection[str] | None = None) -> None:
    """`providers`: the provider names this server has (None: not checked)."""
    violations: list[FieldViolation] = []
    if not agents:
        violations.append(FieldViolation("agents", "define at least one agent"))
    names = [agent.name for agent in agents]
    seen: set[str] = set()
    for index, agent in enumerate(agents):
        where = f"agents[{index}]"
        if not AGENT_NAME.match(agent.name):
            violations.append(
                FieldViolation(
                    f"{where}.name",
                    f"{agent.name!r} is not a valid agent name: use 1-64 letters, digits, '_' or '-', starting with a letter",
                )
            )
        elif agent.name in seen:
            violations.append(FieldViolation(f"{where}.name", f"duplicate agent name {agent.name!r}"))
        seen.add(agent.name)
        violations.extend(_check_agent(agent, where, names))
        # A scripted agent runs on the scripted model whatever it names: hosts test offline.
        if providers is not None and agent.provider and not agent.script and agent.provider not in providers:
            violations.append(
                FieldViolation(
                    f"{where}.provider",
                    f"unknown provider {agent.provider!r}; this server has {sorted(providers)} "
                    "(leave it empty for the server's default)",
                )
            )
    if violations:
        raise InvalidArgument(violations)


def check_budget(budget: Budget, where: str) -> list[FieldViolation]:
    violations = []
    for name in ("max_turns", "max_tokens", "max_tool_calls", "max_children", "max_depth"):
        value = getattr(budget, name)
        if value is not None and value < 0:
            violations.append(FieldViolation(f"{where}.{name}", f"must be >= 0 (got {value}); leave it unset for no limit"))
    if budget.max_concurrent is not None and budget.max_concurrent < 1:
        violations.append(
            FieldViolation(f"{where}.max_concurrent", f"must be >= 1 (got {budget.max_concurrent}); leave it unset for no limit")
        )
    if budget.max_wall_time is not None and budget.max_wall_time <= 0:
        violations.append(FieldViolation(f"{where}.max_wall_time", "must be a positive duration; leave it unset for no limit"))
    return violations


def _check_agent(agent: AgentSpec, where: str, agent_names: list[str]) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    tool_names: set[str] = set()
    for index, tool in enumerate(agent.tools):
        at = f"{where}.tools[{index}]"
        if tool.name in BUILTIN_TOOLS:
            violations.append(FieldViolation(f"{at}.name", f"{tool.name!r} is a built-in tool; choose another name"))
        elif not TOOL_NAME.match(tool.name):
            violations.append(
                FieldViolation(f"{at}.name", f"{tool.name!r} is not a valid tool name: 1-64 letters, digits, '_' or '-'")
            )
        elif tool.name in tool_names:
            violations.append(FieldViolation(f"{at}.name", f"duplicate tool name {tool.name!r} in agent {agent.name!r}"))
        tool_names.add(tool.name)
        violations.extend(_check_schema(tool.input_schema, f"{at}.input_schema"))
        if isinstance(tool.executor, HttpExecutor):
            violations.extend(_check_url(tool.executor.url, f"{at}.http.url"))
            if tool.executor.timeout <= 0:
                violations.append(FieldViolation(f"{at}.http.timeout", "must be a positive duration"))
    for index, member in enumerate(agent.team):
        if member not in agent_names:
            violations.append(
                FieldViolation(f"{where}.team[{index}]", f"unknown agent {member!r}; define it in the same runtime")
            )
    if len(set(agent.team)) != len(agent.team):
        violations.append(FieldViolation(f"{where}.team", "names an agent more than once"))
    violations.extend(check_budget(agent.budget, f"{where}.budget"))
    gate = agent.completion
    if gate.max_attempts < 0:
        violations.append(FieldViolation(f"{where}.completion.max_attempts", "must be >= 0 (0 means 1)"))
    if gate.must_match:
        try:
            re.compile(gate.must_match)
        except re.error as exc:
            violations.append(FieldViolation(f"{where}.completion.must_match", f"invalid regular expression: {exc}"))
    if gate.judge_agent and gate.judge_agent not in agent_names:
        violations.append(
            FieldViolation(
                f"{where}.completion.judge_agent", f"unknown agent {gate.judge_agent!r}; define it in the same runtime"
            )
        )
    callable_tools = tool_names | ({"task"} if agent.team else set()) | {"ask"}
    for index, rail in enumerate(agent.guardrails):
        if rail.tool not in callable_tools:
            violations.append(
                FieldViolation(f"{where}.guardrails[{index}].tool", f"agent {agent.name!r} has no tool {rail.tool!r}")
            )
    for index, reply in enumerate(agent.script):
        for call_index, call in enumerate(reply.tool_calls):
            at = f"{where}.script.replies[{index}].tool_calls[{call_index}]"
            if call.name not in callable_tools:
                violations.append(FieldViolation(f"{at}.name", f"agent {agent.name!r} has no tool {call.name!r}"))
            try:
                arguments = json.loads(call.arguments_json or "{}")
            except ValueError as exc:
                violations.append(FieldViolation(f"{at}.arguments_json", f"not valid JSON: {exc}"))
                continue
            if not isinstance(arguments, dict):
                violations.append(FieldViolation(f"{at}.arguments_json", "must be a JSON object"))
        if reply.tokens < 0:
            violations.append(FieldViolation(f"{where}.script.replies[{index}].tokens", "must be >= 0"))
    return violations


def _check_schema(schema: dict[str, object], where: str) -> list[FieldViolation]:
    if not schema:
        return []
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return [FieldViolation(where, f"not a valid JSON Schema: {exc.message}")]
    if schema.get("type", "object") != "object":
        return [FieldViolation(where, "tool arguments are a JSON object: the schema's type must be 'object'")]
    return []


def _check_url(url: str, where: str) -> list[FieldViolation]:
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        valid = False
    if valid:
        return []
    return [FieldViolation(where, f"{url!r} is not an absolute http(s) URL")]
