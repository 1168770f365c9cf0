"""MCP servers as tool sources. At CreateRuntime each agent's servers are listed once and
their tools become the agent's own, named `<server>__<tool>`: they are stored with the
runtime's definitions, so a replay or a restart sees exactly the tools the runtime was
created with, whatever the server lists later."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from .. import limits
from ..errors import FieldViolation, shown
from ..ports import McpClient, McpError, McpTool
from ..vocabulary import AgentSpec, McpExecutor, McpServerSpec, ToolSpec
from . import schemas
from .validation import TOOL_NAME

SEPARATOR = "__"


async def with_mcp_tools(agents: Sequence[AgentSpec], client: McpClient) -> tuple[tuple[AgentSpec, ...], list[FieldViolation]]:
    """The agents with their MCP servers' tools, and what was wrong (a server that could not
    be listed, an allowed tool it does not list, a tool whose name cannot be prefixed or whose
    schema an AgentDef could not have, more tools than an agent may have, more bytes of tools
    than a runtime may keep from its MCP servers). check_agents runs again over the result:
    every listed tool is held to what an AgentDef's is."""
    found: list[FieldViolation] = []
    expanded = []
    kept = 0  # bytes of the listed tools kept, over every agent
    for index, agent in enumerate(agents):
        added: list[ToolSpec] = []
        for number, server in enumerate(agent.mcp_servers):
            where = f"agents[{index}].mcp_servers[{number}]"
            try:
                listed = await client.list_tools(server)
            except McpError as error:
                found.append(FieldViolation(where, f"MCP server {server.name!r} could not be listed: {error}"))
                continue
            tools = _tools_of(server, listed, where, found)
            if len(agent.tools) + len(added) + len(tools) > limits.MAX_TOOLS_PER_AGENT:
                found.append(
                    FieldViolation(
                        where,
                        f"MCP server {server.name!r} gives {len(tools)} tools, more than the agent's limit of "
                        f"{limits.MAX_TOOLS_PER_AGENT} with its other tools: name the ones to use in allowed_tools",
                    )
                )
            added.extend(tools)
            kept += sum(len(tool.description.encode()) + _json_size(tool.input_schema) + _output_size(tool) for tool in tools)
            if kept > limits.MAX_LISTED_BYTES:
                # Nothing more is listed: the runtime is refused whatever the other servers say.
                found.append(
                    FieldViolation(
                        where,
                        f"with MCP server {server.name!r}, the tools MCP servers give this runtime come to more than "
                        f"{limits.MAX_LISTED_BYTES:,} bytes (descriptions, and input and output schemas as JSON): "
                        "name the ones to use in allowed_tools",
                    )
                )
                return tuple(agents), found
        expanded.append(dataclasses.replace(agent, tools=agent.tools + tuple(added)) if added else agent)
    return tuple(expanded), found


def _tools_of(server: McpServerSpec, listed: list[McpTool], where: str, found: list[FieldViolation]) -> list[ToolSpec]:
    by_name = {tool.name: tool for tool in listed}
    for index, name in enumerate(server.allowed_tools):
        if name not in by_name:
            found.append(
                FieldViolation(f"{where}.allowed_tools[{index}]", f"MCP server {server.name!r} lists no tool {shown(name)}")
            )
    chosen = [by_name[name] for name in server.allowed_tools if name in by_name] if server.allowed_tools else listed
    tools = []
    for tool in chosen:
        name = f"{server.name}{SEPARATOR}{tool.name}"
        if not TOOL_NAME.fullmatch(name):
            found.append(
                FieldViolation(
                    where,
                    f"tool {shown(tool.name)} of MCP server {server.name!r} gives no valid tool name ({shown(name)}): "
                    "leave it out with allowed_tools",
                )
            )
            continue
        problem = _schema_problem("input", tool.input_schema) or _schema_problem("output", tool.output_schema)
        if problem:
            found.append(
                FieldViolation(
                    where,
                    f"tool {shown(tool.name)} of MCP server {server.name!r}: its {problem}: leave it out with allowed_tools",
                )
            )
            continue
        # A description is prose for the model: cut to the bound an AgentDef's is held to.
        description = tool.description.encode()[: limits.MAX_DESCRIPTION_BYTES].decode(errors="ignore")
        executor = McpExecutor(server.name, server.url, tool.name, dict(server.headers), server.timeout, tool.output_schema)
        tools.append(ToolSpec(name=name, description=description, input_schema=tool.input_schema, executor=executor))
    return tools


def _schema_problem(which: str, schema: dict[str, Any] | None) -> str:
    """What is wrong with a listed tool's schema, checked as an AgentDef's tool schema is; ""."""
    if schema is None:
        return ""
    try:
        schemas.check(schema)
    except schemas.SchemaProblem as problem:
        return f"{which} schema {problem}"
    return ""


def _output_size(tool: ToolSpec) -> int:
    executor = tool.executor
    return _json_size(executor.output_schema) if isinstance(executor, McpExecutor) and executor.output_schema else 0


def _json_size(value: Any) -> int:
    """Bytes as compact JSON (ASCII: non-ASCII is escaped), as schemas.check counts them."""
    return len(json.dumps(value, separators=(",", ":")))
