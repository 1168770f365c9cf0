"""Reservations (docs/budgets.md#reservations) with a real provider's output cap: Anthropic
requires one, so an agent that sets none is sent the provider's max_output_tokens, and that cap
is reserved. What reservations do (30 children at once within a parent's budget or a tenant's
quota, refused turns saying why, holds released when a turn fails, is cut or interrupted, a
budget that asks) is the fast tier's: tests/domain/test_budget_reservations.py."""

from __future__ import annotations

import json
from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.anthropic_server import ScriptedAnthropicServer, Turn
from tests.support.build import agent, create, run
from tests.support.servers import serve

# Micro-units per token (a price per million tokens).
PRICES = {"input": 2.5, "cache_read": 0.25, "cache_write": 3.125, "output": 10}


async def test_anthropics_default_output_cap_is_reserved(anthropic: ScriptedAnthropicServer, tmp_path: Path) -> None:
    """Anthropic requires a cap: unset on the agent, the provider's max_output_tokens (4096) is
    sent, and reserved: 4096 x 10 micros does not fit a max_cost of 10,000, so no call is made.
    With the agent's own cap of 100 the same turn fits."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"currency": "USD", "prices": [{"provider": "anthropic", "model": "claude", **PRICES}]}))
    anthropic.script("claude", lambda body: Turn(text="ok", input_tokens=10, output_tokens=5))
    providers = {"anthropic": {"style": "anthropic", "base_url": anthropic.base_url, "api_key": "sk-ant-test"}}
    async with serve(providers=providers, prices=str(prices)) as served:
        budget = pb.Budget(max_cost=10_000)
        runtime_id = await create(
            served.stub,
            agent("uncapped", model="claude", provider="anthropic", budget=budget),
            agent("capped", model="claude", provider="anthropic", budget=budget, max_output_tokens=100),
        )
        _, stopped = await run(served.stub, runtime_id, "uncapped", "go")
        assert (stopped.status, stopped.limit, stopped.turns) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_COST, 0), stopped
        assert "its output cap of 4,096 tokens" in stopped.text
        assert anthropic.calls["claude"] == 0
        _, done = await run(served.stub, runtime_id, "capped", "go")
        assert (done.status, done.own_cost.micros) == (pb.STATUS_DONE, 10 * 2.5 + 5 * 10), done
        assert [body["max_tokens"] for body in anthropic.requests] == [100]
