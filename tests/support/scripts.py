"""Model scripts and tools that tests of several subjects share: the relay tool (the host runs it)
and an answer to its Request, the library's failing plan (stage, approve, commit), a stepper
that calls a tool once a turn, and a coordinator that delegates one task per prompt."""

from __future__ import annotations

from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.model_server import Reply, tool_results

RELAY = pb.RelayTool()


def relay_tool(name: str) -> pb.ToolDef:
    return pb.ToolDef(name=name, description=f"the host's {name}", relay=RELAY)


def stage_approve_commit(body: dict[str, Any]) -> Reply:
    """The library's failing plan, chosen by the number k of tool results so far."""
    k = tool_results(body)
    if k == 0:
        return Reply(calls=[("counter", {"step": "stage"})], tokens=50)
    if k == 1:
        return Reply(calls=[("approve", {})], tokens=50)
    if k == 2:
        return Reply(calls=[("counter", {"step": "commit"})], tokens=50)
    return Reply(text="committed", tokens=50)


STEPS = 6


def stepper(body: dict[str, Any]) -> Reply:
    """One tool call a turn until the tool has run STEPS times, then the answer."""
    last_tool = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "tool"), None)
    done = int(last_tool.rsplit("#", 1)[1]) if last_tool else 0
    if done >= STEPS:
        return Reply(text="all steps done", tokens=10)
    return Reply(text=f"step {done + 1}: " + "noting progress " * 12, calls=[("step", {"n": done + 1})], tokens=10)


def relay_answer(request: pb.Request, output: str = "fetched") -> pb.Answer:
    return pb.Answer(id=request.id, ok=True, outputs=[pb.ToolOutput(call_id=request.calls[0].id, output=output)])


def delegates_to_worker(*prompts: str, delay: float = 0.0) -> Any:
    """A coordinator that delegates one task per prompt to `worker`, then says it is done."""

    def script(body: dict[str, Any]) -> Reply:
        if tool_results(body) == 0:
            return Reply(calls=[("task", {"agent": "worker", "prompt": p}) for p in prompts], tokens=10, delay=delay)
        return Reply(text="coordinated", tokens=10)

    return script
