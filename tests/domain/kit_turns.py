"""What the fast tier's tests of the turn loop, budgets, usage and deltas share, beside the
harness (tests/domain/harness.py, which they do not change):

- `PlannedModel`: a provider that answers with ScriptedReply values per agent and tells its
  output cap, as a real provider does. An agent with a script always runs on the embedded
  scripted model, which reserves nothing (runs/reservations.py); an agent without one runs on
  this provider, and its turns are reserved.
- `Benches`: benches built with other prices or quotas, or with the planned model, drained
  after the test (the `benches` fixture).
- `Watcher`: a watcher following a runtime's events (with deltas, or not) as a Watch does.
- `Figures`: every handle's figures read again and again; none may ever go down. And
  `assert_tree_rule`: a parent's totals are its own plus its children's totals.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from agentruntime_server.domain.billing.prices import Price, PriceTable
from agentruntime_server.domain.billing.usage import Cost, Tokens, Usage
from agentruntime_server.domain.journal.events import Event, EventKind
from agentruntime_server.domain.journal.handle import Handle
from agentruntime_server.domain.limits import Limits, Quotas
from agentruntime_server.domain.ports import ModelReply, ModelRequest, PriceSource, ReplyBound, Services
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.runtime.service import RuntimeService
from agentruntime_server.domain.vocabulary import AgentSpec, ScriptedReply
from agentruntime_server.domain.watching.deltas import Delta
from agentruntime_server.providers.router import ProviderRouter
from agentruntime_server.providers.scripted import ScriptedProvider
from agentruntime_server.store.memory import MemoryStore

from tests.domain.harness import Bench, HttpTools, bench_with
from tests.support.clock import FakeClock

PLANNED = "planned"  # the planned model's provider name (the price table's key)

# Each test runs in milliseconds: one that has not ended in 20 s is a rule broken into a run
# that never settles (a loop with no limit, a Wait on a clock nobody moves), and fails as such
# (with the stacks) instead of holding the suite to its 300 s timeout. Set as `pytestmark`.
NEVER_HANGS = pytest.mark.timeout(20)


def price(provider: str, model: str, input: str, cache_read: str = "0", cache_write: str = "0", output: str = "0") -> Price:
    """Prices per million tokens: a token of a kind costs that many micro-units."""
    return Price(provider, model, Decimal(input), Decimal(cache_read), Decimal(cache_write), Decimal(output))


def prices(*entries: Price, currency: str = "USD") -> PriceTable:
    return PriceTable(currency, entries)


class SwitchablePrices:
    """A PriceSource whose table the test changes, as a new AGENTRUNTIME_PRICES file would."""

    def __init__(self, table: PriceTable) -> None:
        self.current = table

    def cost(self, provider: str, model: str, tokens: Tokens) -> Cost:
        return self.current.cost(provider, model, tokens)

    def price(self, provider: str, model: str) -> Price | None:
        return self.current.price(provider, model)


class PlannedModel:
    """The ModelProvider of agents without a script: each agent's replies are planned by the
    test (`plan`), played by the embedded scripted model (the same stops, usage, delays and
    streamed pieces), and its reply bound is the agent's model and output cap, so a turn is
    reserved before it starts. Reply i answers the call made after i assistant messages, as a
    script does; or, planned `by_call`, the agent's i-th call (a failed, interrupted or cut turn
    leaves no assistant message). An agent in `unreported` gets replies without usage, as from
    a provider that reports none."""

    def __init__(self, clock: FakeClock) -> None:
        self.scripted = ScriptedProvider(sleep=clock.sleep)
        self.scripts: dict[str, tuple[ScriptedReply, ...]] = {}
        self.by_call: set[str] = set()
        self.unreported: set[str] = set()
        self.calls: Counter[str] = Counter()
        self.requests: list[ModelRequest] = []
        self.in_flight = 0
        self.peak = 0  # the most calls in flight at once

    def plan(self, agent_name: str, *replies: ScriptedReply, by_call: bool = False) -> None:
        self.scripts[agent_name] = replies
        if by_call:
            self.by_call.add(agent_name)

    def reply_bound(self, agent: AgentSpec) -> ReplyBound:
        return ReplyBound(agent.model or "scripted", agent.max_output_tokens)

    async def complete(self, request: ModelRequest) -> ModelReply:
        name = request.agent.name
        self.calls[name] += 1
        self.requests.append(request)
        replies = self.scripts[name]
        if name in self.by_call:
            replies = (replies[min(self.calls[name], len(replies)) - 1],)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            played = dataclasses.replace(request, agent=dataclasses.replace(request.agent, script=replies))
            made = await self.scripted.complete(played)
        finally:
            self.in_flight -= 1
        return dataclasses.replace(made, usage=None) if name in self.unreported else made


async def planned_bench(
    prices: PriceSource | None = None, quotas: Quotas | None = None, limits: Limits | None = None
) -> tuple[Bench, PlannedModel]:
    """A bench whose agents without a script run on a PlannedModel (the default provider)."""
    clock = FakeClock()
    store = MemoryStore()
    tools = HttpTools()
    scripted = ScriptedProvider(sleep=clock.sleep)
    planned = PlannedModel(clock)
    extra: dict[str, Any] = {} if prices is None else {"prices": prices}
    made = Services(
        models=ProviderRouter({"scripted": scripted, PLANNED: planned}, PLANNED, scripted),
        http_tools=tools,
        store=store,
        clock=clock,
        quotas=quotas or Quotas(),
        limits=limits or Limits(),
        **extra,
    )
    return Bench(clock, store, tools, RuntimeService(made)), planned


class Benches:
    """Builds benches for one test and drains them after it."""

    def __init__(self) -> None:
        self.built: list[Bench] = []

    async def scripted(self, **services: Any) -> Bench:
        """A harness bench (bench_with) with other prices, quotas, limits or observers."""
        made = await bench_with(**services)
        self.built.append(made)
        return made

    async def planned(self, prices: PriceSource | None = None, quotas: Quotas | None = None) -> tuple[Bench, PlannedModel]:
        made, model = await planned_bench(prices, quotas)
        self.built.append(made)
        return made, model


@pytest.fixture
async def benches() -> AsyncIterator[Benches]:
    made = Benches()
    yield made
    for bench in made.built:
        await bench.service.drain(0)


# ---- watching ------------------------------------------------------------------------------


class Watcher:
    """Follows a runtime's event log from `after` (with deltas or not) into `items`, as a
    Watch stream does, until stopped."""

    def __init__(self, runtime: Runtime, after: int = 0, deltas: bool = True) -> None:
        self.items: list[Event | Delta] = []
        self._task = asyncio.ensure_future(self._read(runtime, after, deltas))

    async def _read(self, runtime: Runtime, after: int, deltas: bool) -> None:
        async for item in runtime.events.follow(after, deltas=deltas):
            self.items.append(item)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    @property
    def events(self) -> list[Event]:
        return [item for item in self.items if isinstance(item, Event)]

    def deltas(self, handle_id: str, turn: int | None = None) -> list[Delta]:
        return [
            item
            for item in self.items
            if isinstance(item, Delta) and item.handle_id == handle_id and (turn is None or item.turn == turn)
        ]

    def kinds(self, handle_id: str) -> list[str]:
        """The handle's items in order: an event's kind, or `delta`."""
        return [
            "delta" if isinstance(item, Delta) else item.kind.name
            for item in self.items
            if item.handle_id == handle_id and not (isinstance(item, Event) and item.kind is EventKind.RUNTIME_GONE)
        ]


def joined(pieces: list[Delta]) -> str:
    return "".join(piece.text for piece in pieces)


# ---- figures -------------------------------------------------------------------------------


def assert_tree_rule(runtime: Runtime) -> None:
    """For every handle: its totals (tokens, the split, cost, tool calls) are its own plus its
    children's totals."""
    for handle in runtime.handles.values():
        usage, children = handle.usage, [child.usage for child in handle.children]
        assert usage.total_tokens == usage.own_tokens + sum(child.total_tokens for child in children), handle.id
        total = usage.own_split
        for child in children:
            total = total.plus(child.total_split)
        assert usage.total_split == total, handle.id
        assert usage.total_split.total == usage.total_tokens and usage.own_split.total == usage.own_tokens, handle.id
        assert usage.total_cost.micros == usage.own_cost.micros + sum(child.total_cost.micros for child in children)
        assert usage.subtree_tool_calls == usage.tool_calls + sum(child.subtree_tool_calls for child in children)


def _counts(usage: Usage) -> tuple[int, ...]:
    """Every count a figure holds, each of which may only grow."""
    return (
        usage.turns,
        usage.own_tokens,
        usage.total_tokens,
        usage.tool_calls,
        usage.subtree_tool_calls,
        *usage.own_split,
        *usage.total_split,
        usage.own_cost.micros,
        usage.total_cost.micros,
    )


class Figures:
    """Every handle's figures, read whenever the test says (and from every TURN_ENDED event, as
    an observer): no count ever goes down from one read to the next."""

    def __init__(self) -> None:
        self.reads: dict[str, list[tuple[int, ...]]] = {}

    def observe(self, runtime_id: str, event: Event) -> None:
        if event.kind is EventKind.TURN_ENDED and event.usage is not None:
            self.reads.setdefault(event.handle_id, []).append(_counts(event.usage))

    def read(self, runtime: Runtime) -> None:
        for handle in runtime.handles.values():
            self.reads.setdefault(handle.id, []).append(_counts(handle.usage))
        assert_tree_rule(runtime)

    def assert_never_decrease(self) -> None:
        for handle_id, reads in self.reads.items():
            for earlier, later in itertools.pairwise(reads):
                assert all(a <= b for a, b in zip(earlier, later, strict=True)), (handle_id, earlier, later)


def child_of(runtime: Runtime, parent_id: str, agent_name: str = "") -> Handle:
    """The one child of `parent_id` (of the agent, if named)."""
    [child] = [handle for handle in runtime.handles[parent_id].children if not agent_name or handle.agent.name == agent_name]
    return child
