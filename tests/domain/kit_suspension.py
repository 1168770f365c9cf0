"""What the fast tier's tests of suspension, delegation, lifecycle and restore need beyond the
harness (tests/domain/harness.py): a scripted model that counts its calls (per agent, and how
many are out at once), http tools that take time on the fake clock (so that a call can be in
flight when the process stops), and the process itself stopped and started again on the same
memory store, as a crash and a restart would leave it.

    async def test_x(stage: Stage) -> None:
        runtime = await stage.create(agent("w", reply(calls=(("fetch", {}),)), reply("done"), tools=(relay_tool("fetch"),)))
        request = pending_of(await stage.run(runtime, "w", "go"))
        done = await stage.answer(runtime, request, outputs=outputs_for(request, "data"))
        assert (done.text, stage.model.calls["w"]) == ("done", 2)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from agentruntime_server.domain.limits import Limits, Quotas
from agentruntime_server.domain.ports import ModelReply, ModelRequest, Services
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.runtime.service import RuntimeService
from agentruntime_server.domain.vocabulary import (
    AgentSpec,
    Answer,
    Budget,
    HttpExecutor,
    PendingRequest,
    RelayExecutor,
    ScriptedReply,
    TaskResult,
    ToolOutput,
    ToolResult,
    ToolSpec,
    ToolSuspension,
)
from agentruntime_server.providers.router import ProviderRouter
from agentruntime_server.providers.scripted import ScriptedProvider
from agentruntime_server.store.memory import MemoryStore

from tests.domain.harness import Bench, HttpTools, agent, http_tool, reply
from tests.support.clock import FakeClock

Chooser = Callable[[ModelRequest], ScriptedReply]
SETTLE_TRIES = 20  # rounds of the clock's settle a call is given to return, time standing still


class CountedModel(ScriptedProvider):
    """The embedded scripted model, counting what it is asked: calls per agent, the requests in
    order, and the most calls out at once. `choose[agent]` picks an agent's reply from the
    request (what it was sent) instead of its script's position, for a script a position
    cannot say (a reply that depends on the prompt)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(sleep=clock.sleep)
        self.calls: Counter[str] = Counter()
        self.requests: list[ModelRequest] = []
        self.choose: dict[str, Chooser] = {}
        self.in_flight = 0
        self.peak = 0

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.calls[request.agent.name] += 1
        self.requests.append(request)
        chooser = self.choose.get(request.agent.name)
        if chooser is not None:
            request = dataclasses.replace(request, agent=dataclasses.replace(request.agent, script=(chooser(request),)))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await super().complete(request)
        finally:
            self.in_flight -= 1

    def sent(self, agent: str) -> list[ModelRequest]:
        return [request for request in self.requests if request.agent.name == agent]


@dataclass
class ClockedTools(HttpTools):
    """In-process http tools (the harness's) that may take time: a call of a tool in `delays`
    is out that many seconds of the fake clock before its body answers. A call is counted
    when it reaches the tool, so one cut off while out counts as run (it may have acted)."""

    sleep: Callable[[float], Awaitable[None]] | None = None
    delays: dict[str, float] = field(default_factory=dict)
    answers: list[Answer | None] = field(default_factory=list)  # the host's answer each call carried

    async def run(self, executor: HttpExecutor, arguments_json: str, key: str, answer: Any = None) -> ToolResult | ToolSuspension:
        name = executor.url.rsplit("/", 1)[-1]
        arguments = json.loads(arguments_json)
        self.calls.append((name, arguments, key))
        self.answers.append(answer)
        delay = self.delays.get(name, 0.0)
        if delay and self.sleep is not None:
            await self.sleep(delay)
        body = self.bodies.get(name)
        outcome = body(arguments) if body is not None else f"{name} ok #{self.count(name)}"
        return ToolResult(outcome) if isinstance(outcome, str) else outcome

    def keys(self, name: str) -> list[str]:
        return [key for called, _, key in self.calls if called == name]


@dataclass
class Stage(Bench):
    """A bench whose model counts its calls and whose tools take time; `restarted` stops its
    process as a crash would and starts another on the same store, clock, tools and model."""

    tools: ClockedTools
    model: CountedModel = field(kw_only=True)
    made: Services = field(kw_only=True)
    processes: list[RuntimeService] = field(kw_only=True)  # every process started, to stop at the end

    async def restarted(self, recover: bool = True, down: float = 0.0) -> Stage:
        """The process stops with its runs cut where they are (nothing more is journaled: what
        was RUNNING stays so in the store), `down` seconds pass with no process, and a new one
        starts on the same store; with `recover`, it takes over what needs a process (a run in
        flight, a heartbeat, a Request that expires), as a server does at its start."""
        await self.service.drain(0)
        await self.clock.advance(down)
        after = dataclasses.replace(self, service=RuntimeService(self.made))
        self.processes.append(after.service)
        if recover:
            await after.service.recover()
            await self.clock.advance(0)  # what came due while it was down fires now, as the loop's next round would
        return after

    async def reloaded(self, runtime: Runtime) -> Runtime:
        """The runtime as another process reads it back from the store (Runtime.restore: replayed,
        nothing armed, nothing run)."""
        stored = await self.store.load(runtime.key)
        assert stored is not None
        return Runtime.restore(runtime.id, stored, self.made, runtime.key)

    async def run(self, runtime: Runtime, agent_name: str, prompt: str, budget: Budget | None = None) -> TaskResult:
        """Spawns a top-level handle, wakes it with the prompt, and reads its result (settled)."""
        handle_id = await self.spawn(runtime, agent_name, budget=budget)
        await runtime.wake(handle_id, prompt)
        return await self.settled(runtime, handle_id)

    async def settled(self, runtime: Runtime, handle_id: str) -> TaskResult:
        """The handle's result (Wait), once what is ready has run with time standing still: a
        handle that would need the clock moved fails the test here instead of hanging it."""
        return await self.done(runtime.wait(handle_id, None), f"a Wait on {handle_id}")

    async def resumed(self, runtime: Runtime, answer: Answer) -> TaskResult:
        """Resume, settled as `settled` is."""
        return await self.done(runtime.resume(answer), f"the Resume of {answer.id}")

    async def answer(self, runtime: Runtime, request: PendingRequest, **answer: Any) -> TaskResult:
        return await self.resumed(runtime, Answer(id=request.id, **{"ok": True, **answer}))

    async def done(self, work: Awaitable[TaskResult], what: str) -> TaskResult:
        task = asyncio.ensure_future(work)
        for _ in range(SETTLE_TRIES):
            if task.done():
                return task.result()
            await self.clock.settle()
        task.cancel()
        raise AssertionError(f"{what} did not return with the clock standing still (it waits on time, or for ever)")

    async def stop(self) -> None:
        for service in self.processes:
            await service.drain(0)


async def stage_with(clock: FakeClock | None = None, quotas: Quotas | None = None, limits: Limits | None = None) -> Stage:
    clock = clock or FakeClock()
    store = MemoryStore()
    tools = ClockedTools(sleep=clock.sleep)
    model = CountedModel(clock)
    made = Services(
        models=ProviderRouter({"scripted": model}, "scripted", model),
        http_tools=tools,
        store=store,
        clock=clock,
        quotas=quotas or Quotas(),
        limits=limits or Limits(),
    )
    service = RuntimeService(made)
    return Stage(clock, store, tools, service, model=model, made=made, processes=[service])


@pytest.fixture
async def stage() -> AsyncIterator[Stage]:
    made = await stage_with()
    yield made
    await made.stop()


# ---- tools and answers ------------------------------------------------------------------


def relay_tool(name: str, **fields: Any) -> ToolSpec:
    """A tool the host runs: its calls suspend the handle on a `tool_call` Request."""
    return ToolSpec(
        name=name, description=f"the host's {name}", input_schema={"type": "object"}, executor=RelayExecutor(), **fields
    )


def gated_tool(name: str, prompt: str = "") -> ToolSpec:
    """An http tool that runs only once the host approves the call."""
    return http_tool(name, approval_required=True, approval_prompt=prompt)


def outputs_for(request: PendingRequest, *texts: str) -> tuple[ToolOutput, ...]:
    """One output per call of a relay Request, in order."""
    return tuple(ToolOutput(call_id=call.id, output=text) for (call, _), text in zip(request.calls, texts, strict=True))


def pending_of(result: TaskResult) -> PendingRequest:
    assert result.pending is not None, result
    return result.pending


def tool_messages(runtime: Runtime, handle_id: str) -> list[tuple[str, bool]]:
    """The handle's tool messages: (content, is_error)."""
    return [(message.content, message.is_error) for message in runtime.transcript(handle_id) if message.role == "tool"]


def last_user(request: ModelRequest) -> str:
    return next(message.content for message in reversed(request.messages) if message.role == "user")


def tool_results_sent(request: ModelRequest) -> int:
    return sum(1 for message in request.messages if message.role == "tool")


# ---- agents several subjects share -------------------------------------------------------------

LEAD = "root/coordinator.1"
WORKER = "root/worker.1"


def stage_approve_commit() -> AgentSpec:
    """The library's failing plan: stage (http), approve (the host runs it), commit (http), then the answer."""
    return agent(
        "worker",
        reply(calls=(("counter", {"step": "stage"}),), tokens=50),
        reply(calls=(("approve", {}),), tokens=50),
        reply(calls=(("counter", {"step": "commit"}),), tokens=50),
        reply("committed", tokens=50),
        tools=(http_tool("counter"), relay_tool("approve")),
    )


def task(prompt: str, mate: str = "worker") -> tuple[str, dict[str, Any]]:
    return ("task", {"agent": mate, "prompt": prompt})


def coordinator(*prompts: str, tokens: int = 100) -> AgentSpec:
    """Delegates one task per prompt to `worker` in one turn, then says it is done."""
    return agent(
        "coordinator",
        reply(calls=tuple(task(p) for p in prompts), tokens=tokens),
        reply("all done", tokens=tokens),
        team=("worker",),
    )


def worker_suspending_on(stage: Stage, *prompts: str, delays: dict[str, float] | None = None) -> AgentSpec:
    """A worker that calls the host's fetch when its prompt is one of `prompts`, else answers
    "worker <prompt> done"; a prompt in `delays` makes that answer take so many seconds."""

    def choose(request: ModelRequest) -> ScriptedReply:
        prompt = last_user(request) if tool_results_sent(request) == 0 else ""
        if prompt in prompts:
            return reply(calls=(("fetch", {}),), tokens=10)
        asked = next(m.content for m in request.messages if m.role == "user")
        return reply(f"worker {asked} done", tokens=10, delay=(delays or {}).get(asked, 0.0))

    stage.model.choose["worker"] = choose
    return agent("worker", reply("chosen by the request"), tools=(relay_tool("fetch"),))
