"""The server's schema judge (process/schema_judges.py): checks run in worker processes, each
within a time budget; a worker that spends it is killed and replaced, one cancelled mid-check
too (its verdict must not answer the next check), and a tenant has one check in the workers at a
time, so that a tenant's costly checks never keep another tenant's waiting. Real processes."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agentruntime_server.domain.definitions.schemas import CheckNotDone
from agentruntime_server.process.schema_judges import SchemaJudges

from tests.support.poll import until

UNIQUE = json.dumps({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}})
TWO_WAYS = json.dumps(
    {
        "type": "array",
        "items": {"anyOf": [{"$ref": "#"}, {"$ref": "#/$defs/m"}, {"type": "string"}]},
        "$defs": {"m": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/m"}, {"$ref": "#"}, {"type": "string"}]}}},
    }
)


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.fixture
async def judges() -> AsyncIterator[SchemaJudges]:
    made = SchemaJudges(workers=2, seconds=1.0)
    yield made
    await made.close()


def workers_of(judges: SchemaJudges) -> list[Any]:
    return [worker.process for worker in judges._workers if worker.process is not None]


async def mid_check(judges: SchemaJudges) -> Any:
    """The process of the worker a check is with, once it is."""
    await until(lambda: any(worker.checking for worker in judges._workers), "a check to be with a worker", timeout=60)
    [process] = [worker.process for worker in judges._workers if worker.checking]
    return process


async def test_verdicts_are_jsonschemas_whatever_the_cost(judges: SchemaJudges) -> None:
    assert await judges.problem("acme", UNIQUE, json.dumps({"a": [{}, *range(4000)]})) is None
    problem = await judges.problem("acme", UNIQUE, json.dumps({"a": [{}, 1, 1]}))
    assert problem == "[{}, 1, 1] has non-unique elements"
    assert await judges.problem("acme", UNIQUE, '{"a": ["\\ud800", "x"]}') is None  # a lone surrogate travels
    assert judges.checks == {"valid": 2, "problem": 1}


async def test_a_check_past_its_budget_is_not_done_and_its_worker_is_replaced(judges: SchemaJudges) -> None:
    await judges.problem("acme", UNIQUE, "{}")  # a worker is up
    started = time.monotonic()
    with pytest.raises(CheckNotDone, match="checking it took longer than the limit of 1 s"):
        await judges.problem("acme", TWO_WAYS, nested(24))
    assert 1.0 <= time.monotonic() - started < 10
    assert all(process.poll() is None for process in workers_of(judges))  # the stopped one is gone, reaped
    assert await judges.problem("acme", TWO_WAYS, nested(3)) is not None  # a new worker judges the next
    assert judges.checks["not_done"] == 1


async def test_a_check_cancelled_midway_stops_its_worker_and_the_next_check_is_not_answered_with_its_verdict() -> None:
    judges = SchemaJudges(workers=1, seconds=60)  # the check is cancelled long before its budget is spent
    check = asyncio.ensure_future(judges.problem("acme", TWO_WAYS, nested(30)))
    process = await mid_check(judges)
    check.cancel()
    with pytest.raises(asyncio.CancelledError):
        await check
    assert process.poll() is not None  # stopped, and reaped
    try:
        assert await judges.problem("acme", UNIQUE, json.dumps({"a": [1, 2]})) is None
        assert await judges.problem("acme", UNIQUE, json.dumps({"a": [1, 1]})) == "[1, 1] has non-unique elements"
    finally:
        await judges.close()


async def test_a_tenants_costly_checks_hold_one_worker_and_another_tenants_check_goes_on(judges: SchemaJudges) -> None:
    await asyncio.gather(judges.problem("a", UNIQUE, "{}"), judges.problem("b", UNIQUE, "{}"))  # both workers up
    costly = [asyncio.ensure_future(judges.problem("acme", TWO_WAYS, nested(24))) for _ in range(3)]
    await asyncio.sleep(0)  # acme's first check takes a worker; its other two wait their turn, not for workers
    assert await judges.problem("globex", UNIQUE, json.dumps({"a": [1, 2]})) is None
    # Judged in the other worker while acme's first check (a second at least) was still going.
    assert not any(check.done() for check in costly)
    outcomes = await asyncio.gather(*costly, return_exceptions=True)
    assert all(isinstance(outcome, CheckNotDone) for outcome in outcomes)


async def test_a_worker_killed_midcheck_makes_that_check_not_done() -> None:
    judges = SchemaJudges(workers=1, seconds=60)
    check = asyncio.ensure_future(judges.problem("acme", TWO_WAYS, nested(30)))
    (await mid_check(judges)).kill()
    try:
        with pytest.raises(CheckNotDone, match="stopped before it ended"):
            await check
        assert await judges.problem("acme", UNIQUE, "{}") is None
    finally:
        await judges.close()


async def test_a_worker_is_given_no_secret_of_the_servers_environment(
    judges: SchemaJudges, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTRUNTIME_LLM_API_KEY", "sk-secret-of-the-server")
    await judges.problem("acme", UNIQUE, "{}")
    [process] = workers_of(judges)
    environ = await asyncio.to_thread(Path(f"/proc/{process.pid}/environ").read_bytes)
    assert b"sk-secret-of-the-server" not in environ and b"PATH=" in environ
    assert os.environ["AGENTRUNTIME_LLM_API_KEY"] == "sk-secret-of-the-server"
