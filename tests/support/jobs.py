"""One host job, as the fault tests drive it through the Python client with its default
options (tests/e2e/test_failover_invisible.py, test_store_weather.py): a coordinator that
delegates two parts to workers, each making HITS http calls; the host creates the runtime,
spawns the coordinator, posts it a note, wakes it and waits. And what every such job must
show afterwards, whatever failed meanwhile."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, http_tool
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.tool_server import ToolServer

HITS = 2  # a worker's http calls, one after another
NOTE = "the customer is in Lisbon"
# What every job settles with: 200 own tokens, and 2 workers x 3 turns x 10.
EXACT = {"status": pb.STATUS_DONE, "text": "merged", "turns": 2, "own_tokens": 200, "total_tokens": 260, "tool_calls": 2}


def coordinator(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        job = last_user(body)[:40]
        return Reply(calls=[("task", {"agent": "worker", "prompt": f"{job} part {n}"}) for n in (1, 2)], tokens=100)
    return Reply(text="merged", tokens=100)


def worker(body: dict[str, Any]) -> Reply:
    done = tool_results(body)
    if done < HITS:
        return Reply(calls=[("hit", {"job": last_user(body), "n": done})], tokens=10, delay=0.05)
    return Reply(text="worked", tokens=10)


def script(model: ScriptedModelServer) -> None:
    model.script("coordinator", coordinator)
    model.script("worker", worker)


async def one_root(client: Client, tools: ToolServer, job: int) -> tuple[str, pb.TaskResult]:
    """What a host does for one job, with nothing but the client's defaults between it and
    the failures: create, spawn, post a note, wake, wait."""
    definitions = [agent("coordinator", team=["worker"]), agent("worker", tools=[http_tool("hit", tools.url("hit"))])]
    runtime_id = await client.create_runtime(definitions)
    handle_id = await client.spawn(runtime_id, "coordinator")
    await client.post(runtime_id, handle_id, NOTE)
    await client.wake(runtime_id, handle_id, f"job {job}")
    return runtime_id, await client.wait(runtime_id, handle_id)


async def assert_each_job_once(target: str, settled: list[tuple[str, pb.TaskResult]], roots: int) -> None:
    """Every job exact; none woken twice (one user message) and no note posted twice."""
    results = [result for _, result in settled]
    assert all({name: getattr(r, name) for name in EXACT} == EXACT for r in results), Counter(
        str({name: getattr(r, name) for name in EXACT}) for r in results
    )
    async with Client(target) as reader:
        for runtime_id, result in settled:
            messages = await reader.transcript(runtime_id, result.handle_id)
            users = [m.content for m in messages if m.role == "user"]
            assert len(users) == 1, users
            assert users[0].count(NOTE) == 1, users[0]
        assert len(await reader.list_runtimes()) == roots
