"""The fast tier's harness: the runtime service itself (domain/runtime/service.py) on the memory
store, with the embedded scripted model, a fake clock (tests/support/clock.py) and in-process
tools; no gRPC, no HTTP, no process. What the api tier checks on the wire, this tier checks as
the domain's own rules, in milliseconds.

    async def test_x(bench: Bench) -> None:
        runtime = await bench.create(agent("solo", replies=[reply("done", tokens=5)]))
        result = await bench.run(runtime, "solo", "go")
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from agentruntime_server.domain.billing.usage import Tokens
from agentruntime_server.domain.limits import Limits, Quotas
from agentruntime_server.domain.ports import Services
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.runtime.service import RuntimeService
from agentruntime_server.domain.vocabulary import (
    AgentSpec,
    Answer,
    Budget,
    HttpExecutor,
    ReplyStop,
    ScriptedReply,
    ScriptedToolCall,
    TaskResult,
    ToolCall,
    ToolResult,
    ToolSpec,
    ToolSuspension,
)
from agentruntime_server.providers.router import ProviderRouter
from agentruntime_server.providers.scripted import ScriptedProvider
from agentruntime_server.store.memory import MemoryStore

from tests.support.clock import FakeClock

ToolBody = Callable[[dict[str, Any]], "str | ToolResult | ToolSuspension"]


def reply(
    text: str = "",
    tokens: int = 5,
    calls: tuple[tuple[str, dict[str, Any] | str], ...] = (),
    delay: float = 0.0,
    usage: Tokens | None = None,
    stop: ReplyStop = ReplyStop.COMPLETE,
) -> ScriptedReply:
    """One scripted model reply: text, or tool calls (name, arguments)."""
    return ScriptedReply(
        text=text,
        tokens=tokens,
        tool_calls=tuple(
            ScriptedToolCall(name=name, arguments_json=arguments if isinstance(arguments, str) else json.dumps(arguments))
            for name, arguments in calls
        ),
        delay=delay,
        usage=usage,
        stop=stop,
    )


def http_tool(name: str, schema: dict[str, Any] | None = None, **fields: Any) -> ToolSpec:
    """An http tool; the bench's HttpTools answers it (no network)."""
    return ToolSpec(
        name=name,
        description=f"the {name} tool",
        input_schema=schema or {"type": "object"},
        executor=HttpExecutor(url=f"https://tools.example/{name}"),
        **fields,
    )


def agent(name: str, *replies: ScriptedReply, **fields: Any) -> AgentSpec:
    """A scripted agent: its replies in order (the last one again once they run out)."""
    return AgentSpec(name=name, description=f"the {name} agent", script=tuple(replies), **fields)


@dataclass
class HttpTools:
    """The HttpToolRunner port: each tool's body is a function of its arguments, run in-process.
    Calls are kept in order, with their idempotency keys."""

    bodies: dict[str, ToolBody] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)

    async def run(self, executor: HttpExecutor, arguments_json: str, key: str, answer: Any = None) -> ToolResult | ToolSuspension:
        name = executor.url.rsplit("/", 1)[-1]
        arguments = json.loads(arguments_json)
        self.calls.append((name, arguments, key))
        body = self.bodies.get(name)
        outcome = body(arguments) if body is not None else "ok"
        return ToolResult(outcome) if isinstance(outcome, str) else outcome

    def count(self, name: str) -> int:
        return sum(1 for called, _, _ in self.calls if called == name)


@dataclass
class Bench:
    """A runtime service on the memory store, a fake clock and in-process tools."""

    clock: FakeClock
    store: MemoryStore
    tools: HttpTools
    service: RuntimeService
    tenant: str = "default"

    async def create(self, *agents: AgentSpec, runtime_id: str = "", tenant: str = "") -> Runtime:
        created = await self.service.create_runtime(runtime_id, agents, tenant=tenant or self.tenant)
        return await self.service.runtime(created, tenant or self.tenant)

    async def spawn(self, runtime: Runtime, agent_name: str, parent: str = "root", budget: Budget | None = None) -> str:
        handle = await runtime.spawn(parent, agent_name, budget)
        return handle.id

    async def run(self, runtime: Runtime, agent_name: str, prompt: str, budget: Budget | None = None) -> TaskResult:
        """Spawns a top-level handle, wakes it with the prompt and waits for its result."""
        handle_id = await self.spawn(runtime, agent_name, budget=budget)
        await runtime.wake(handle_id, prompt)
        return await runtime.wait(handle_id, None)

    async def resume(self, runtime: Runtime, result: TaskResult, **answer: Any) -> TaskResult:
        """Answers the result's pending Request (ok unless told otherwise)."""
        assert result.pending is not None, result
        return await runtime.resume(Answer(id=result.pending.id, **{"ok": True, **answer}))


async def bench_with(
    clock: FakeClock | None = None,
    quotas: Quotas | None = None,
    limits: Limits | None = None,
    **services: Any,
) -> Bench:
    clock = clock or FakeClock()
    store = MemoryStore()
    tools = HttpTools()
    scripted = ScriptedProvider(sleep=clock.sleep)
    made = Services(
        models=ProviderRouter({"scripted": scripted}, "scripted", scripted),
        http_tools=tools,
        store=store,
        clock=clock,
        quotas=quotas or Quotas(),
        limits=limits or Limits(),
        **services,
    )
    return Bench(clock, store, tools, RuntimeService(made))


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    made = await bench_with()
    yield made
    await made.service.drain(0)


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call_{name}", name=name, arguments_json=json.dumps(arguments))
