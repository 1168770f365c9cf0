"""Checks on what a caller defines: every problem found is reported at once, by field path."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .. import limits
from ..billing.usage import Tokens
from ..errors import FieldViolation, InvalidArgument, shown
from ..limits import Limits
from ..vocabulary import AgentSpec, Budget, HttpExecutor, McpServerSpec, RuntimeOptions, ScriptedReply, WorkerExecutor
from . import schemas as tool_schemas
from .patterns import PatternError, compile_pattern

if TYPE_CHECKING:
    from ..ports import Services, UrlPolicy

RUNTIME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# Tool names become model function names: the strictest common provider rule.
TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
BUILTIN_TOOLS = ("task", "ask")
MCP_SERVER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
QUEUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a worker queue (WorkerTool.queue)
# RFC 9110 field names are tokens; values are visible ASCII, spaces and tabs: no header
# injection, and nothing an HTTP library refuses only when the call is made.
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
HEADER_VALUE_FORBIDDEN = re.compile(r"[^\t\x20-\x7e]")
# Headers the runtime sets itself or that change how the request is framed.
RESERVED_HEADERS = frozenset({"idempotency-key", "content-length", "transfer-encoding", "host", "connection", "content-type"})


def check_runtime_id(runtime_id: str) -> None:
    if not RUNTIME_ID.fullmatch(runtime_id):
        raise InvalidArgument(
            [
                FieldViolation(
                    "runtime_id",
                    f"{shown(runtime_id)} is not a plain slug: use 1-64 letters, digits, '_', '-' or '.', "
                    "starting with a letter or digit (or leave it empty to have one generated)",
                )
            ]
        )


def check_agents(
    agents: Sequence[AgentSpec],
    providers: Collection[str] | None = None,
    found: Sequence[FieldViolation] = (),
    urls: UrlPolicy | None = None,
) -> None:
    """`providers`: the provider names this server has (None: not checked). `found`: what the
    edge already found wrong while decoding (reported together with the rest). `urls`: the
    egress policy every URL is checked against before anything connects (None: not checked)."""
    violations: list[FieldViolation] = list(found)
    if not agents:
        violations.append(FieldViolation("agents", "define at least one agent"))
    if len(agents) > limits.MAX_AGENTS:
        raise InvalidArgument([*violations, FieldViolation("agents", f"define at most {limits.MAX_AGENTS} agents")])
    names = [agent.name for agent in agents]
    seen: set[str] = set()
    for index, agent in enumerate(agents):
        where = f"agents[{index}]"
        if not AGENT_NAME.fullmatch(agent.name):
            violations.append(
                FieldViolation(
                    f"{where}.name",
                    f"{shown(agent.name)} is not a valid agent name: use 1-64 letters, digits, '_' or '-', "
                    "starting with a letter",
                )
            )
        elif agent.name in seen:
            violations.append(FieldViolation(f"{where}.name", f"duplicate agent name {agent.name!r}"))
        seen.add(agent.name)
        violations.extend(_check_agent(agent, where, names, urls))
        # A scripted agent runs on the scripted model whatever it names: hosts test offline.
        if providers is not None and agent.provider and not agent.script and agent.provider not in providers:
            violations.append(
                FieldViolation(
                    f"{where}.provider",
                    f"unknown provider {shown(agent.provider)}; this server has {sorted(providers)} "
                    "(leave it empty for the server's default)",
                )
            )
    violations.extend(_team_cycles(agents))
    if violations:
        raise InvalidArgument(violations)


def _team_cycles(agents: Sequence[AgentSpec]) -> list[FieldViolation]:
    """Delegation (team members and judges) must not lead back to an agent: a cycle would
    spawn handles without end."""
    edges = {
        agent.name: [
            *agent.team,
            *filter(None, [agent.completion.judge_agent, agent.compaction.summarizer_agent if agent.compaction else ""]),
        ]
        for agent in agents
    }
    index = {agent.name: position for position, agent in reversed(list(enumerate(agents)))}
    violations: list[FieldViolation] = []
    reported: set[frozenset[str]] = set()
    for start in edges:
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            name, path = stack.pop()
            for member in edges.get(name, []):
                if member == start:
                    cycle = frozenset(path)
                    if cycle not in reported:
                        reported.add(cycle)
                        violations.append(
                            FieldViolation(
                                f"agents[{index[start]}].team",
                                f"delegation leads back to {start!r} ({' -> '.join([*path, start])}); "
                                "teams and judges must not form a cycle",
                            )
                        )
                elif member in edges and member not in seen:
                    seen.add(member)
                    stack.append((member, [*path, member]))
    return violations


def check_budget(budget: Budget, where: str) -> list[FieldViolation]:
    violations = []
    for name in ("max_turns", "max_tokens", "max_tool_calls", "max_children", "max_depth", "max_cost"):
        value = getattr(budget, name)
        if value is not None and value < 0:
            violations.append(FieldViolation(f"{where}.{name}", f"must be >= 0 (got {value}); leave it unset for no limit"))
    if budget.max_concurrent is not None and budget.max_concurrent < 1:
        violations.append(
            FieldViolation(f"{where}.max_concurrent", f"must be >= 1 (got {budget.max_concurrent}); leave it unset for no limit")
        )
    if budget.max_wall_time is not None and budget.max_wall_time <= 0:
        violations.append(FieldViolation(f"{where}.max_wall_time", "must be a positive duration; leave it unset for no limit"))
    elif budget.max_wall_time is not None and budget.max_wall_time > limits.MAX_WALL_TIME:
        violations.append(FieldViolation(f"{where}.max_wall_time", f"must be at most {limits.MAX_WALL_TIME / 86400:g} days"))
    return violations


def _check_agent(agent: AgentSpec, where: str, agent_names: list[str], urls: UrlPolicy | None) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    violations.extend(_check_sizes(agent, where))
    if len(agent.mcp_servers) > limits.MAX_MCP_SERVERS:
        violations.append(FieldViolation(f"{where}.mcp_servers", f"names more than {limits.MAX_MCP_SERVERS} servers"))
    server_names: set[str] = set()
    for index, server in enumerate(agent.mcp_servers[: limits.MAX_MCP_SERVERS]):
        violations.extend(check_mcp_server(server, f"{where}.mcp_servers[{index}]", urls))
        if server.name in server_names:
            violations.append(FieldViolation(f"{where}.mcp_servers[{index}].name", f"duplicate server name {server.name!r}"))
        server_names.add(server.name)
    if agent.output_schema is not None:
        violations.extend(_check_output_schema(agent.output_schema, f"{where}.output_schema"))
    tool_names: set[str] = set()
    for index, tool in enumerate(agent.tools[: limits.MAX_TOOLS_PER_AGENT]):
        at = f"{where}.tools[{index}]"
        if tool.name in BUILTIN_TOOLS:
            violations.append(FieldViolation(f"{at}.name", f"{tool.name!r} is a built-in tool; choose another name"))
        elif not TOOL_NAME.fullmatch(tool.name):
            violations.append(
                FieldViolation(f"{at}.name", f"{shown(tool.name)} is not a valid tool name: 1-64 letters, digits, '_' or '-'")
            )
        elif tool.name in tool_names:
            violations.append(FieldViolation(f"{at}.name", f"duplicate tool name {tool.name!r} in agent {shown(agent.name)}"))
        tool_names.add(tool.name)
        if len(tool.description.encode()) > limits.MAX_DESCRIPTION_BYTES:
            violations.append(FieldViolation(f"{at}.description", f"is longer than {limits.MAX_DESCRIPTION_BYTES} bytes"))
        violations.extend(_check_schema(tool.input_schema, f"{at}.input_schema"))
        if isinstance(tool.executor, HttpExecutor):
            violations.extend(_check_http(tool.executor, f"{at}.http", urls))
        elif isinstance(tool.executor, WorkerExecutor):
            violations.extend(check_worker(tool.executor, f"{at}.worker"))
        if len(tool.approval_prompt.encode()) > limits.MAX_DESCRIPTION_BYTES:
            violations.append(FieldViolation(f"{at}.approval.prompt", f"is longer than {limits.MAX_DESCRIPTION_BYTES} bytes"))
    for index, member in enumerate(agent.team[: limits.MAX_TEAM]):
        if member not in agent_names:
            violations.append(
                FieldViolation(f"{where}.team[{index}]", f"unknown agent {shown(member)}; define it in the same runtime")
            )
    if len(set(agent.team)) != len(agent.team):
        violations.append(FieldViolation(f"{where}.team", "names an agent more than once"))
    violations.extend(check_budget(agent.budget, f"{where}.budget"))
    if agent.heartbeat is not None:
        if not limits.MIN_HEARTBEAT <= agent.heartbeat.every <= limits.MAX_HEARTBEAT:
            violations.append(
                FieldViolation(
                    f"{where}.heartbeat.every",
                    f"must be between {limits.MIN_HEARTBEAT:g}s and {limits.MAX_HEARTBEAT / 86400:g} days",
                )
            )
        if len(agent.heartbeat.prompt.encode()) > limits.MAX_DESCRIPTION_BYTES:
            violations.append(FieldViolation(f"{where}.heartbeat.prompt", f"is longer than {limits.MAX_DESCRIPTION_BYTES} bytes"))
    if agent.compaction is not None:
        compaction = agent.compaction
        if compaction.max_context_tokens < 1:
            violations.append(FieldViolation(f"{where}.compaction.max_context_tokens", "must be >= 1"))
        if compaction.keep_last_turns < 0:
            violations.append(FieldViolation(f"{where}.compaction.keep_last_turns", "must be >= 0 (0 means 2)"))
        if compaction.summarizer_agent not in agent_names:
            violations.append(
                FieldViolation(
                    f"{where}.compaction.summarizer_agent",
                    f"unknown agent {shown(compaction.summarizer_agent)}; define it in the same runtime",
                )
            )
    if agent.max_output_tokens is not None and not 1 <= agent.max_output_tokens <= limits.MAX_OUTPUT_TOKENS:
        violations.append(
            FieldViolation(f"{where}.max_output_tokens", f"must be between 1 and {limits.MAX_OUTPUT_TOKENS:,} (or unset)")
        )
    gate = agent.completion
    if gate.max_attempts < 0:
        violations.append(FieldViolation(f"{where}.completion.max_attempts", "must be >= 0 (0 means 1)"))
    if gate.must_match:
        try:
            compile_pattern(gate.must_match)
        except PatternError as exc:
            violations.append(FieldViolation(f"{where}.completion.must_match", f"invalid regular expression: {exc}"))
    if gate.judge_agent and gate.judge_agent not in agent_names:
        violations.append(
            FieldViolation(
                f"{where}.completion.judge_agent", f"unknown agent {shown(gate.judge_agent)}; define it in the same runtime"
            )
        )
    callable_tools = tool_names | ({"task"} if agent.team else set()) | {"ask"}
    for index, rail in enumerate(agent.guardrails[: limits.MAX_GUARDRAILS]):
        if rail.tool not in callable_tools:
            violations.append(
                FieldViolation(f"{where}.guardrails[{index}].tool", f"agent {shown(agent.name)} has no tool {shown(rail.tool)}")
            )
        if len(rail.reason.encode()) > limits.MAX_DESCRIPTION_BYTES:
            violations.append(
                FieldViolation(f"{where}.guardrails[{index}].reason", f"is longer than {limits.MAX_DESCRIPTION_BYTES} bytes")
            )
    for index, reply in enumerate(agent.script[: limits.MAX_SCRIPT_REPLIES]):
        violations.extend(_check_reply(agent, reply, f"{where}.script.replies[{index}]", callable_tools))
    return violations


def _check_sizes(agent: AgentSpec, where: str) -> list[FieldViolation]:
    """Counts and sizes: what is stored and sent to a model stays bounded."""
    bounds = [
        ("tools", len(agent.tools), limits.MAX_TOOLS_PER_AGENT, "tools"),
        ("team", len(agent.team), limits.MAX_TEAM, "team mates"),
        ("guardrails", len(agent.guardrails), limits.MAX_GUARDRAILS, "guardrails"),
        ("script.replies", len(agent.script), limits.MAX_SCRIPT_REPLIES, "replies"),
        ("description", len(agent.description.encode()), limits.MAX_DESCRIPTION_BYTES, "bytes"),
        ("instructions", len(agent.instructions.encode()), limits.MAX_INSTRUCTIONS_BYTES, "bytes"),
        ("model", len(agent.model), limits.MAX_MODEL_CHARS, "characters"),
    ]
    violations = [
        FieldViolation(f"{where}.{field}", f"has {count} {unit}; the limit is {limit}")
        for field, count, limit, unit in bounds
        if count > limit
    ]
    if any(ord(char) < 32 for char in agent.model):
        violations.append(FieldViolation(f"{where}.model", "must not contain control characters"))
    return violations


def _check_reply(agent: AgentSpec, reply: ScriptedReply, at: str, callable_tools: set[str]) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    for call_index, call in enumerate(reply.tool_calls):
        call_at = f"{at}.tool_calls[{call_index}]"
        if call.name not in callable_tools:
            violations.append(FieldViolation(f"{call_at}.name", f"agent {shown(agent.name)} has no tool {shown(call.name)}"))
        if len(call.arguments_json.encode()) > limits.MAX_ARGUMENTS_BYTES:
            violations.append(FieldViolation(f"{call_at}.arguments_json", f"is longer than {limits.MAX_ARGUMENTS_BYTES} bytes"))
            continue
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except (ValueError, RecursionError) as exc:
            violations.append(FieldViolation(f"{call_at}.arguments_json", f"not valid JSON: {shown(str(exc))}"))
            continue
        if not isinstance(arguments, dict):
            violations.append(FieldViolation(f"{call_at}.arguments_json", "must be a JSON object"))
    if len(reply.text.encode()) > limits.MAX_INSTRUCTIONS_BYTES:
        violations.append(FieldViolation(f"{at}.text", f"is longer than {limits.MAX_INSTRUCTIONS_BYTES} bytes"))
    if not 0 <= reply.tokens <= limits.MAX_REPLY_TOKENS:
        violations.append(FieldViolation(f"{at}.tokens", f"must be between 0 and {limits.MAX_REPLY_TOKENS:,}"))
    if reply.usage is not None:
        violations += _check_usage(reply.usage, reply.tokens, f"{at}.usage")
    if not 0 <= reply.delay <= limits.MAX_SCRIPT_DELAY:
        violations.append(FieldViolation(f"{at}.delay", f"must be between 0 and {limits.MAX_SCRIPT_DELAY:g}s"))
    if not 0 <= reply.stream_chunk_chars <= limits.MAX_STREAM_CHUNK_CHARS:
        violations.append(FieldViolation(f"{at}.stream_chunk_chars", f"must be between 0 and {limits.MAX_STREAM_CHUNK_CHARS:,}"))
    if not 0 <= reply.stream_pause <= limits.MAX_STREAM_PAUSE:
        violations.append(FieldViolation(f"{at}.stream_pause", f"must be between 0 and {limits.MAX_STREAM_PAUSE:g}s"))
    return violations


def _check_usage(usage: Tokens, tokens: int, at: str) -> list[FieldViolation]:
    violations = []
    parts = {
        "input_tokens": usage.input,
        "cache_read_tokens": usage.cache_read,
        "cache_write_tokens": usage.cache_write,
        "output_tokens": usage.output,
        "reasoning_tokens": usage.reasoning,
    }
    for name, value in parts.items():
        if not 0 <= value <= limits.MAX_REPLY_TOKENS:
            violations.append(FieldViolation(f"{at}.{name}", f"must be between 0 and {limits.MAX_REPLY_TOKENS:,}"))
    if violations:
        return violations
    if usage.reasoning > usage.output:
        violations.append(FieldViolation(f"{at}.reasoning_tokens", "must be at most output_tokens (reasoning is part of output)"))
    if usage.total > limits.MAX_REPLY_TOKENS:
        violations.append(FieldViolation(at, f"adds up to more than {limits.MAX_REPLY_TOKENS:,} tokens for one reply"))
    if tokens and tokens != usage.total:
        violations.append(
            FieldViolation(f"{at[: -len('.usage')]}.tokens", f"must be 0 or the usage's sum ({usage.total}) when usage is set")
        )
    return violations


def check_worker(executor: WorkerExecutor, where: str) -> list[FieldViolation]:
    violations = []
    if not QUEUE.fullmatch(executor.queue):
        violations.append(
            FieldViolation(f"{where}.queue", f"{shown(executor.queue)} is not a queue name: letters, digits, '_', '.', '-', 1-64")
        )
    if not 0 < executor.timeout <= limits.MAX_TOOL_TIMEOUT:
        violations.append(
            FieldViolation(f"{where}.timeout", f"must be a positive duration of at most {limits.MAX_TOOL_TIMEOUT:g}s")
        )
    return violations


def _check_http(executor: HttpExecutor, where: str, urls: UrlPolicy | None = None) -> list[FieldViolation]:
    violations = _check_url(executor.url, f"{where}.url", urls)
    if not 0 < executor.timeout <= limits.MAX_TOOL_TIMEOUT:
        violations.append(
            FieldViolation(f"{where}.timeout", f"must be a positive duration of at most {limits.MAX_TOOL_TIMEOUT:g}s")
        )
    violations.extend(_check_headers(executor.headers, f"{where}.headers"))
    return violations


def _check_headers(headers: dict[str, str], where: str) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    if len(headers) > limits.MAX_HEADERS:
        return [FieldViolation(where, f"has {len(headers)} headers; the limit is {limits.MAX_HEADERS}")]
    for name, value in headers.items():
        # The value is a secret: no violation ever quotes it.
        at = f"{where}[{shown(name, 40)}]"
        if not HEADER_NAME.fullmatch(name) or len(name) > limits.MAX_HEADER_NAME_CHARS:
            violations.append(
                FieldViolation(at, f"is not a header name: 1-{limits.MAX_HEADER_NAME_CHARS} token characters (RFC 9110)")
            )
        elif name.lower() in RESERVED_HEADERS:
            violations.append(FieldViolation(at, "is set by the runtime itself; remove it"))
        if HEADER_VALUE_FORBIDDEN.search(value):
            violations.append(
                FieldViolation(
                    at,
                    "the value must be visible ASCII, spaces and tabs: no CR, LF or NUL, no other control or non-ASCII character",
                )
            )
        if len(value.encode()) > limits.MAX_HEADER_VALUE_BYTES:
            violations.append(FieldViolation(at, f"the value is longer than {limits.MAX_HEADER_VALUE_BYTES} bytes"))
    return violations


def check_mcp_server(server: McpServerSpec, where: str, urls: UrlPolicy | None = None) -> list[FieldViolation]:
    """An MCP server's definition, checked before anything connects to it."""
    violations = []
    if not MCP_SERVER_NAME.fullmatch(server.name):
        violations.append(
            FieldViolation(f"{where}.name", f"{shown(server.name)} is not a server name: 1-32 letters, digits, '_', '-'")
        )
    violations.extend(_check_url(server.url, f"{where}.url", urls))
    violations.extend(_check_headers(server.headers, f"{where}.headers"))
    if not 0 < server.timeout <= limits.MAX_TOOL_TIMEOUT:
        violations.append(
            FieldViolation(f"{where}.timeout", f"must be a positive duration of at most {limits.MAX_TOOL_TIMEOUT:g}s")
        )
    if len(server.allowed_tools) > limits.MAX_TOOLS_PER_AGENT:
        violations.append(FieldViolation(f"{where}.allowed_tools", f"names more than {limits.MAX_TOOLS_PER_AGENT} tools"))
    for index, name in enumerate(server.allowed_tools[: limits.MAX_TOOLS_PER_AGENT]):
        if not 0 < len(name) <= 128:
            violations.append(FieldViolation(f"{where}.allowed_tools[{index}]", "must be 1-128 characters"))
    return violations


def _check_schema(schema: dict[str, object], where: str) -> list[FieldViolation]:
    if not schema:
        return []
    try:
        tool_schemas.check(schema)
    except tool_schemas.SchemaProblem as exc:
        return [FieldViolation(where, str(exc))]
    return []


def _check_output_schema(schema: dict[str, object], where: str) -> list[FieldViolation]:
    """As a tool's input schema, with an `object` at the top: OpenAI's structured outputs take
    no other root (an array is its HTTP 400), and wrapping one would not be faithful (the
    model would write the wrapper, which the text, the transcript and the gate then hold)."""
    if schema.get("type") != "object":
        return [
            FieldViolation(
                where,
                'must have "type": "object" at the top, as OpenAI\'s structured outputs require; put a list in a property: '
                '{"type": "object", "properties": {"items": {"type": "array"}}}',
            )
        ]
    return _check_schema(schema, where)


def _check_url(url: str, where: str, urls: UrlPolicy | None = None) -> list[FieldViolation]:
    if len(url) > limits.MAX_URL_CHARS or any(ord(char) <= 32 for char in url):
        return [
            FieldViolation(
                where,
                f"{shown(_without_credentials(url))} is not an absolute http(s) URL of at most {limits.MAX_URL_CHARS} "
                "characters without spaces or control characters",
            )
        ]
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        valid = False
    if not valid:
        return [FieldViolation(where, f"{shown(_without_credentials(url))} is not an absolute http(s) URL")]
    if "@" in parts.netloc:
        # A URL is shown in errors, logs and events; a credential goes in a header.
        return [FieldViolation(where, "must not carry credentials (user:password@); send them in a header")]
    refusal = urls.url_refusal(url) if urls is not None else None
    return [FieldViolation(where, refusal)] if refusal else []


def _without_credentials(url: str) -> str:
    """The URL as an error may quote it: whatever stands before an '@' of its authority is hidden."""
    return re.sub(r"^([^:/?#]*:?//)[^/?#]*@", r"\1[credentials]@", url)


def check_options(options: RuntimeOptions, services: Services) -> list[FieldViolation]:
    """A runtime's own settings stay within the server's."""
    violations = []
    if not 0 <= options.inbox_capacity <= services.inbox_capacity:
        violations.append(
            FieldViolation("options.inbox_capacity", f"must be between 0 (the server's) and {services.inbox_capacity}")
        )
    most = services.limits.max_concurrent_model_calls
    if not 0 <= options.max_concurrent_model_calls <= most:
        violations.append(
            FieldViolation("options.max_concurrent_model_calls", f"must be between 0 (no limit of its own) and {most}")
        )
    return violations


def check_text_size(text: str, field: str, bounds: Limits, limit: int | None = None) -> None:
    """Text a caller sends (a Post, a prompt, a tool output) stays under the server's limit."""
    size = len(text.encode())
    most = bounds.max_text_bytes if limit is None else limit
    if size > most:
        raise InvalidArgument(
            [
                FieldViolation(
                    field,
                    f"is {size} bytes; the limit is {most} (AGENTRUNTIME_MAX_TEXT_BYTES)"
                    if limit is None
                    else f"is {size} bytes; the limit is {most}",
                )
            ]
        )
