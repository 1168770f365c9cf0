"""MCP servers as tool sources. At CreateRuntime each agent's servers are listed once and
their tools become the agent's own, named `<server>__<tool>`: they are stored with the
runtime's definitions, so a replay or a restart sees exactly the tools the runtime was
created with, whatever the server lists later."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from . import limits
from .errors import FieldViolation, shown
from .model import AgentSpec, McpExecutor, McpServerSpec, ToolSpec
from .ports import McpClient, McpError, McpTool
from .validation import TOOL_NAME

SEPARATOR = "__"


async def with_mcp_tools(agents: Sequence[AgentSpec], client: McpClient) -> tuple[tuple[AgentSpec, ...], list[FieldViolation]]:
    """The agents with their MCP servers' tools, and what was wrong (a server that could not
    be listed, an allowed tool it does not list, a tool whose name cannot be prefixed)."""
    found: list[FieldViolation] = []
    expanded = []
    for index, agent in enumerate(agents):
        added: list[ToolSpec] = []
        for number, server in enumerate(agent.mcp_servers):
            where = f"agents[{index}].mcp_servers[{number}]"
            try:
                listed = await client.list_tools(server)
            except McpError as error:
                found.append(FieldViolation(where, f"MCP server {server.name!r} could not be listed: {error}"))
                continue
            added.extend(_tools_of(server, listed, where, found))
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
        description = tool.description.encode()[: limits.MAX_DESCRIPTION_BYTES].decode(errors="ignore")
        executor = McpExecutor(server.name, server.url, tool.name, dict(server.headers), server.timeout)
        tools.append(ToolSpec(name=name, description=description, input_schema=tool.input_schema, executor=executor))
    return tools
