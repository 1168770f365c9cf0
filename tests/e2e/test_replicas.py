"""Replicas on one PostgreSQL database: forwarding, failover, graceful handoff, with real server
processes on a real PostgreSQL hurt with signals and with the database's own
pg_terminate_backend: an owner paused past its lease that wakes with work in hand, an owner
whose database connections break, and calls at the other replica meanwhile. (Leases and
fencing with two stores driven by the test: tests/store/test_leases.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.domain.journal import CallFinished, CallStarted
from agentruntime_server.store import payloads
from google.protobuf import duration_pb2

from tests.support.auth import READ_TOKEN, WRITE_TOKEN, Pki, bearer, pki, refused, tokens_file, unauthenticated
from tests.support.build import agent, create, http_tool, run, status_details
from tests.support.deltas import joined
from tests.support.deltas import watch as watch_deltas
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.poll import eventually, until
from tests.support.process import ServerProcess
from tests.support.replicas import LEASE, Pair, cut_off, pair, settled_at, started_run
from tests.support.servers import serve
from tests.support.sse import Streamed
from tests.support.tenants import assert_quota
from tests.support.tool_server import ToolServer

__all__ = ["pair", "pki", "tokens_file"]  # fixtures of tests/support (auth.py, replicas.py), used here

T = TypeVar("T")


def coordinator(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        job = last_user(body)
        return Reply(calls=[("task", {"agent": "worker", "prompt": f"{job} part {part}"}) for part in (1, 2)], tokens=100)
    return Reply(text="merged", tokens=100, delay=0.05)


def worker(body: dict[str, Any]) -> Reply:
    """Three http calls one after another (a root lasts a while), then an answer."""
    done = tool_results(body)
    if done < HITS:
        return Reply(calls=[("hit", {"job": last_user(body), "n": done})], tokens=10, delay=0.05)
    return Reply(text="worked", tokens=10)


HITS = 3  # a worker's calls; a root has two workers
# What every root settles with, as one process on SQLite computes it.
EXACT = {"status": pb.STATUS_DONE, "text": "merged", "turns": 2, "own_tokens": 200, "total_tokens": 280, "tool_calls": 2}


def exact(result: pb.TaskResult) -> dict[str, Any]:
    return {name: getattr(result, name) for name in EXACT}


class Cluster:
    """Replicas on one database, and a client that sends each call to a random live one and
    tries another when a replica is down (what a load balancer in front of them does)."""

    def __init__(self, database: str, model: ScriptedModelServer, tmp: Path, size: int) -> None:
        env = {"AGENTRUNTIME_LEASE_DURATION": str(LEASE), "AGENTRUNTIME_SHUTDOWN_GRACE": "5"}
        self.replicas = [ServerProcess(database, model.base_url, tmp / f"replica-{n}.log", env) for n in range(size)]
        self.stubs: dict[int, pb_grpc.AgentRuntimeAsyncStub] = {}

    async def start(self, *which: int) -> None:
        for n in which or range(len(self.replicas)):
            self.stubs[n] = await self.replicas[n].start()

    def down(self, n: int) -> None:
        self.stubs.pop(n, None)

    async def call(self, rpc: Callable[[pb_grpc.AgentRuntimeAsyncStub], Awaitable[T]], patience: float = 60.0) -> T:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        while True:
            stub = random.choice(list(self.stubs.values()))
            try:
                return await rpc(stub)
            except grpc.aio.AioRpcError as error:
                if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or loop.time() > deadline:
                    raise
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        for replica in self.replicas:
            if replica.process is not None and replica.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    replica.process.send_signal(signal.SIGCONT)
                await replica.stop()


@pytest.fixture
async def cluster(database: str, model: ScriptedModelServer, tools: ToolServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    model.script("coordinator", coordinator)
    model.script("worker", worker)
    made = Cluster(database, model, tmp_path, 3)
    await made.start()
    yield made
    await made.stop()


def definitions(tools: ToolServer) -> list[pb.AgentDef]:
    return [agent("coordinator", team=["worker"]), agent("worker", tools=[http_tool("hit", tools.url("hit"))])]


async def start_root(cluster: Cluster, tools: ToolServer, job: int) -> tuple[str, str]:
    """A runtime with one coordinator root, each call of it sent to a random replica."""
    created = await cluster.call(lambda s: s.CreateRuntime(pb.CreateRuntimeRequest(agents=definitions(tools)), timeout=10))
    runtime_id = created.runtime_id
    spawned = await cluster.call(
        lambda s: s.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="coordinator"), timeout=10)
    )
    handle_id = spawned.handle_id
    attempts = 0

    async def wake(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
        nonlocal attempts
        attempts += 1
        try:
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=f"job {job}"), timeout=10)
        except grpc.aio.AioRpcError as error:
            # Wake is not safe to repeat: an earlier attempt whose answer was lost (UNAVAILABLE)
            # may have started the run. A host that retries one reads HANDLE_RUNNING so.
            if (
                attempts == 1
                or error.code() != grpc.StatusCode.FAILED_PRECONDITION
                or "is running" not in (error.details() or "")
            ):
                raise

    await cluster.call(wake)
    return runtime_id, handle_id


async def settled(cluster: Cluster, runtime_id: str, handle_id: str) -> pb.TaskResult:
    while True:
        reply = await cluster.call(
            lambda s: s.Wait(
                pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id, timeout=duration_pb2.Duration(seconds=5)), timeout=20
            ),
            patience=120,
        )
        if reply.result.status != pb.STATUS_TIMEOUT:
            return reply.result


async def watched(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str) -> list[int]:
    """Every event seq of a runtime's stream, up to its root settling."""
    seqs = []
    async for response in stub.Watch(pb.WatchRequest(runtime_id=runtime_id), timeout=120):
        seqs.append(response.event.seq)
        if response.event.handle_id == handle_id and response.event.HasField("result"):
            return seqs
    raise AssertionError("the stream ended before the root settled")


def assert_effects(tools: ToolServer, calls: int, kills: list[int]) -> None:
    """Every worker's one call ran; a call ran again only if it was in doubt: its first run
    reached the tool before a replica went down (`kills`: how many hits there were once it
    was down; none of its runtimes moves before its lease lapses) and the second after,
    with the same Idempotency-Key."""
    first: dict[str, int] = {}
    again: dict[str, int] = {}
    for index, key in enumerate(tools.keys):
        if key in first:
            assert key not in again, f"{key} ran three times"
            again[key] = index
        else:
            first[key] = index
    assert len(first) == calls
    for key, second in again.items():
        assert any(first[key] < kill <= second for kill in kills), (key, first[key], second, kills)


async def test_three_replicas_run_100_roots_sent_to_random_replicas_with_exact_totals(
    cluster: Cluster, tools: ToolServer, model: ScriptedModelServer, tmp_path: Path
) -> None:
    # The figures one process on SQLite gives for the same root are the ones to match.
    async with serve(llm_style="openai", llm_base_url=model.base_url, store=f"sqlite:///{tmp_path / 'one.db'}") as one:
        _, alone = await run(one.stub, await create(one.stub, *definitions(tools)), "coordinator", "job alone")
    assert exact(alone) == EXACT
    tools.keys.clear()
    roots = await asyncio.gather(*(start_root(cluster, tools, job) for job in range(100)))
    results = await asyncio.gather(*(settled(cluster, *root) for root in roots))
    assert all(exact(result) == EXACT for result in results), Counter(str(exact(r)) for r in results)
    assert_effects(tools, 100 * 2 * HITS, [])
    # Reads from any replica (from the database, or the owner's memory) give the same figures.
    for runtime_id, handle_id in random.sample(roots, 10):
        for stub in cluster.stubs.values():
            view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).handle
            assert (view.turns, view.own_tokens, view.total_tokens) == (2, 200, 280)
    # The work spread: each replica created, and so ran, roots of its own (it still holds them).
    owners = await owners_of_runtimes(cluster)
    assert len(owners) == 3 and sum(owners.values()) == 100 and min(owners.values()) >= 10, owners


async def owners_of_runtimes(cluster: Cluster) -> Counter[str]:
    url = cluster.replicas[0].store
    assert isinstance(url, str)
    connection = await asyncpg.connect(url)
    try:
        return Counter(
            {str(owner): count for owner, count in await connection.fetch("SELECT owner, COUNT(*) FROM runtimes GROUP BY owner")}
        )
    finally:
        await connection.close()


async def test_a_forwarded_call_answers_as_the_owner_does_errors_and_details_included(
    cluster: Cluster, tools: ToolServer
) -> None:
    owner, other = cluster.stubs[0], cluster.stubs[1]
    runtime_id = (await owner.CreateRuntime(pb.CreateRuntimeRequest(agents=definitions(tools)), timeout=10)).runtime_id
    # Commands to the runtime through another replica reach its owner.
    handle_id = (await other.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="coordinator"), timeout=10)).handle_id
    await other.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="job 1"), timeout=10)
    waited = await other.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=30)
    assert exact(waited.result) == EXACT
    assert "rpc=Spawn" in cluster.replicas[0].log.read_text()  # the owner served it
    # Both replicas audit the forwarded Spawn, and each line says which side of the hop it is.
    owner_log, other_log = cluster.replicas[0].log.read_text(), cluster.replicas[1].log.read_text()
    [(owner_id, owner_address)] = re.findall(r"replica (\S+) serving at (\S+) ", owner_log)
    [(other_id, _)] = re.findall(r"replica (\S+) serving at (\S+) ", other_log)
    spawned = f"rpc=Spawn runtime={runtime_id} handle=- code=OK"
    assert f"{spawned} forwarded_from={other_id}\n" in owner_log, owner_log
    assert f"{spawned} forwarded_to={owner_address}\n" in other_log, other_log
    assert owner_id != other_id
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await other.Post(pb.PostRequest(runtime_id=runtime_id, handle_id="root/nobody.1", text="hi"), timeout=10)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND and "root/nobody.1" in (missing.value.details() or "")
    [resource] = status_details(missing.value)
    assert (resource.resource_type, resource.resource_name) == ("handle", "root/nobody.1")
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await other.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="stranger"), timeout=10)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and "['coordinator', 'worker']" in (unknown.value.details() or "")
    [resource] = status_details(unknown.value)
    assert (resource.resource_type, resource.resource_name) == ("agent", "stranger")
    # Reads through any replica: the same view; a missing runtime is missing everywhere.
    views = [
        (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)).handle
        for stub in cluster.stubs.values()
    ]
    assert all(view == views[0] for view in views)
    for stub in cluster.stubs.values():
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await stub.Wait(pb.WaitRequest(runtime_id="rt-none", handle_id=handle_id), timeout=10)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    # DeleteRuntime through a replica that does not run it: gone for every replica.
    await cluster.stubs[2].DeleteRuntime(pb.DeleteRuntimeRequest(runtime_id=runtime_id), timeout=10)
    for stub in cluster.stubs.values():
        with pytest.raises(grpc.aio.AioRpcError) as deleted:
            await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=10)
        assert deleted.value.code() == grpc.StatusCode.NOT_FOUND


async def reconnecting_watch(
    cluster: Cluster, stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str
) -> tuple[list[int], int]:
    """A client's Watch that starts on `stub`'s replica and, when that replica goes away,
    reconnects to another live one with its last seq; the seqs it saw, and its reconnects."""
    seqs: list[int] = []
    reconnects = 0
    while True:
        try:
            async for response in stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=seqs[-1] if seqs else 0)):
                seqs.append(response.event.seq)
                if response.event.handle_id == handle_id and response.event.HasField("result"):
                    return seqs, reconnects
        except grpc.aio.AioRpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise
        reconnects += 1
        await asyncio.sleep(0.1)
        stub = random.choice(list(cluster.stubs.values()))


async def test_sigkill_of_two_replicas_mid_run_loses_nothing_and_watch_streams_have_no_gaps(
    cluster: Cluster, tools: ToolServer
) -> None:
    tools.delays["hit"] = 0.3
    roots = await asyncio.gather(*(start_root(cluster, tools, job) for job in range(100)))
    # Watch streams on the replica that survives both kills, for roots run everywhere.
    survivor = cluster.stubs[2]
    watches = [asyncio.ensure_future(watched(survivor, *root)) for root in roots[:12]]
    # And clients watching on the first victim, that reconnect elsewhere with their last seq.
    movers = [asyncio.ensure_future(reconnecting_watch(cluster, cluster.stubs[0], *root)) for root in roots[12:20]]
    await asyncio.sleep(0.3)  # connected to the first victim
    kills: list[int] = []
    for victim, progress in ((0, 150), (1, 400)):  # two kills, at two moments (of 600 calls)
        await until(lambda: sum(tools.hits.values()) >= progress, f"{progress} tool hits", timeout=60)  # noqa: B023
        assert len(tools.keys) < 100 * 2 * HITS, "the kill must come mid-run"
        cluster.replicas[victim].send(signal.SIGKILL)
        cluster.down(victim)
        victim_process = cluster.replicas[victim].process
        assert victim_process is not None
        await victim_process.wait()  # its clients' streams break as they would (the channel stays open)
        await asyncio.sleep(0.1)  # what it sent before it died has arrived
        kills.append(len(tools.keys))
    results = await asyncio.gather(*(settled(cluster, *root) for root in roots))
    assert all(exact(result) == EXACT for result in results), Counter(str(exact(r)) for r in results)
    assert_effects(tools, 100 * 2 * HITS, kills)
    print(f"calls in doubt and run again: {len(tools.keys) - 600} of 600")
    for seqs in await asyncio.gather(*watches):
        assert seqs == list(range(1, len(seqs) + 1))  # no gap, nothing twice
    moved = await asyncio.gather(*movers)
    for seqs, _ in moved:
        assert seqs == list(range(1, len(seqs) + 1))
    assert all(reconnects >= 1 for _, reconnects in moved)


async def test_a_paused_owner_is_fenced_when_it_wakes_and_the_figures_stay_exact(cluster: Cluster, tools: ToolServer) -> None:
    tools.delays["hit"] = 1.0
    owner = cluster.stubs[0]
    runtime_id = (await owner.CreateRuntime(pb.CreateRuntimeRequest(agents=definitions(tools)), timeout=10)).runtime_id
    handles = []
    for job in range(3):
        spawned = await owner.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="coordinator"))
        await owner.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=spawned.handle_id, prompt=f"job {job}"))
        handles.append(spawned.handle_id)
    await until(lambda: len(tools.in_flight_keys) >= 2, "tool calls in flight on the owner", timeout=30)
    stopped = time.time()
    cluster.replicas[0].send(signal.SIGSTOP)  # past its lease: another replica takes the runtime over
    cluster.down(0)
    results = [await settled(cluster, runtime_id, handle) for handle in handles]
    assert all(exact(result) == EXACT for result in results)

    cluster.replicas[0].send(signal.SIGCONT)  # the old owner wakes with its calls answered
    cluster.stubs[0] = owner
    log = cluster.replicas[0].log
    await until(lambda: "its copy stops" in log.read_text(), "the old owner to notice", timeout=30)
    await asyncio.sleep(LEASE)  # anything it would still write has had its chance
    for stub in cluster.stubs.values():  # the woken one included: it reads what the new owner wrote
        for handle, result in zip(handles, results, strict=True):
            waited = await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle), timeout=20)
            assert waited.result == result
    # A call runs twice only if it was in doubt: started before the pause, its result recorded
    # after (the woken owner may still send a call it had started: the same key, for its target to dedupe).
    in_doubt = await calls_in_doubt_at(cluster, runtime_id, stopped)
    per_key = Counter(tools.keys)
    assert len(per_key) == 3 * 2 * HITS and all(hits == 1 or (hits == 2 and key in in_doubt) for key, hits in per_key.items()), (
        per_key,
        in_doubt,
    )


async def calls_in_doubt_at(cluster: Cluster, runtime_id: str, moment: float) -> set[str]:
    """The idempotency keys of the calls whose start the journal has from before `moment` and
    whose result it has from after."""
    url = cluster.replicas[0].store
    assert isinstance(url, str)
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch("SELECT at, step FROM journal WHERE runtime_id = $1 ORDER BY seq", runtime_id)
    finally:
        await connection.close()
    started, finished = set(), set()
    for at, payload in rows:
        step = payloads.decode(payload)
        if isinstance(step, CallStarted) and at < moment:
            started.add(f"{runtime_id}/{step.handle_id}/{step.call.id}")
        elif isinstance(step, CallFinished) and at > moment:
            finished.add(f"{runtime_id}/{step.handle_id}/{step.call.id}")
    return started & finished


async def test_a_rolling_restart_under_load_finishes_every_root(cluster: Cluster, tools: ToolServer) -> None:
    """SIGTERM each replica in turn, each time with a wave of roots in flight: the replica
    drains, gives its leases up, and another takes its runs over with no lease to wait for."""
    tools.delays["hit"] = 0.5
    roots: list[tuple[str, str]] = []
    kills: list[int] = []
    loop = asyncio.get_running_loop()

    def takeovers() -> int:
        return sum(replica.log.read_text().count("running handles from the store") for replica in cluster.replicas)

    for n, wave in enumerate((34, 33, 33)):
        hits = len(tools.keys)
        roots += await asyncio.gather(*(start_root(cluster, tools, len(roots) + job) for job in range(wave)))
        await until(lambda: len(tools.keys) >= hits + 10, "the wave's calls to be under way")  # noqa: B023
        before = takeovers()
        cluster.down(n)
        started = loop.time()
        assert await cluster.replicas[n].stop(signal.SIGTERM) == 0
        assert loop.time() - started < LEASE + 5  # drained within its grace
        kills.append(len(tools.keys))  # its leases are given up only now
        await until(lambda: takeovers() > before, "another replica to take the runs over", timeout=LEASE * 3)  # noqa: B023
        await cluster.start(n)
    results = await asyncio.gather(*(settled(cluster, *root) for root in roots))
    assert all(exact(result) == EXACT for result in results), Counter(str(exact(r)) for r in results)
    assert_effects(tools, 100 * 2 * HITS, kills)


async def test_replicas_forward_over_mtls_with_the_callers_token(
    database: str, pki: Pki, tokens_file: Path, tmp_path: Path
) -> None:
    """TLS with client certificates between everyone, bearer tokens for tenants: a replica
    forwards with the caller's token and presents its own certificate; the owner
    authenticates the call again."""
    ca = tmp_path / "ca.pem"  # one CA signs the replicas' certificates and the clients'
    pki.ca.cert_pem.write_to_path(str(ca))
    settings: dict[str, Any] = {
        "store": database,
        "tls_cert": str(pki.cert),
        "tls_key": str(pki.key),
        "tls_client_ca": str(ca),
        "replica_ca": str(ca),
        "auth": "tokens",
        "auth_tokens_file": str(tokens_file),
    }
    async with serve(**settings) as first, serve(**settings) as second:
        credentials = pki.client_credentials(client_of=pki.ca)
        async with (
            grpc.aio.secure_channel(f"127.0.0.1:{first.running.port}", credentials) as to_first,
            grpc.aio.secure_channel(f"127.0.0.1:{second.running.port}", credentials) as to_second,
        ):
            owner, other = pb_grpc.AgentRuntimeStub(to_first), pb_grpc.AgentRuntimeStub(to_second)
            writer = bearer(WRITE_TOKEN)
            await owner.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="secure", agents=[agent("solo")]), metadata=writer)
            spawned = await other.Spawn(pb.SpawnRequest(runtime_id="secure", agent="solo"), metadata=writer, timeout=10)
            await other.Wake(pb.WakeRequest(runtime_id="secure", handle_id=spawned.handle_id, prompt="hi"), metadata=writer)
            waited = await other.Wait(pb.WaitRequest(runtime_id="secure", handle_id=spawned.handle_id), metadata=writer)
            assert waited.result.status == pb.STATUS_DONE
            assert (first.running.service.cached, second.running.service.cached) == (1, 0)  # run by its owner only
            # The caller's own credentials decide, at both replicas.
            await unauthenticated(other.Wake(pb.WakeRequest(runtime_id="secure", handle_id=spawned.handle_id)), "missing")
            denied = await refused(
                other.Wake(pb.WakeRequest(runtime_id="secure", handle_id=spawned.handle_id), metadata=bearer(READ_TOKEN))
            )
            assert denied.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_watch_forwarded_to_the_runtimes_owner_counts_once_where_it_is_followed(database: str) -> None:
    """AGENTRUNTIME_QUOTA_WATCH_STREAMS counts a Watch where its runtime is followed (the
    owner: what the stream holds is there), not at the replica that forwards it, whatever
    the caller's metadata says: two streams through the other replica are the owner's two,
    the third is refused there with its QuotaFailure relayed, and a cancelled one frees its place."""
    async with serve(store=database, quota_watch_streams=2) as first, serve(store=database, quota_watch_streams=2) as second:
        owner, other = first.stub, second.stub
        runtime_id = await create(owner, agent("solo"))
        await owner.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="solo"), timeout=10)  # the first replica runs it

        async def opened(stub: pb_grpc.AgentRuntimeAsyncStub) -> grpc.aio.UnaryStreamCall[pb.WatchRequest, pb.WatchResponse]:
            call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id), timeout=30)
            first = await call.read()
            assert isinstance(first, pb.WatchResponse) and first.event.seq == 1
            return call

        streams = [await opened(other), await opened(other)]
        at_owner, at_other = (served.running.service.tenancy for served in (first, second))
        assert (at_owner.streams("watch_streams", "default"), at_other.streams("watch_streams", "default")) == (2, 0)
        for stub in (other, owner):
            error = await refused(opened(stub))
            assert_quota(error, "default", "watch_streams")
        # A caller that says it is a replica is counted like any other (the owner follows for it).
        forged = owner.Watch(pb.WatchRequest(runtime_id=runtime_id), metadata=(("x-agentruntime-forwarded", "r"),), timeout=30)
        assert_quota(await refused(forged.read()), "default", "watch_streams")
        streams[0].cancel()
        await until(lambda: at_owner.streams("watch_streams", "default") == 1, "the place to be given back", timeout=10)
        streams[0] = await opened(other)
        for call in streams:
            call.cancel()


# ---- an owner paused past its lease, an owner whose database connections break ----------------------


async def test_an_owner_woken_after_its_lease_moved_buys_no_model_turn(
    pair: Pair, model: ScriptedModelServer, tools: ToolServer
) -> None:
    """The owner is paused with a tool call in flight; the other replica takes the runtime over
    and finishes it (the call in doubt runs again, the second turn is bought there). The old
    owner wakes with the tool's answer in hand: it must not buy the next turn a second time."""
    tools.delays["hit"] = 1.0
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    pair.owner.send(signal.SIGSTOP)
    # Waited on at the other replica: answered there once it has taken the runtime over.
    result = await settled_at(other, runtime_id, handle_id, patience=60)
    assert (result.status, result.text, result.turns) == (pb.STATUS_DONE, "done", 2)
    assert model.calls["solo"] == 2 and tools.hits["hit"] == 2  # the call in doubt ran again, with its key

    pair.owner.send(signal.SIGCONT)  # it reads the tool's answer it was sent while it slept
    log = pair.owner.log
    await until(lambda: "its copy stops" in log.read_text(), "the old owner to notice", timeout=30)
    await asyncio.sleep(1.0)  # a model call it would make has reached the model server by now
    assert model.calls["solo"] == 2, "the fenced replica bought a model turn"
    assert tools.hits["hit"] == 2
    again = await settled_at(owner, runtime_id, handle_id, patience=30)  # and it reads what the new owner wrote
    assert again == result


async def test_an_owner_whose_store_broke_gives_its_runtimes_up(
    pair: Pair, model: ScriptedModelServer, tools: ToolServer
) -> None:
    """The owner's database connections are cut while a tool call is in flight: its next
    commit fails, and its store takes nothing more (it must be restarted). Its lease must not
    outlive that: the other replica takes the runtime over and finishes it, rather than the
    runtime staying with an owner that can write nothing, for good."""
    tools.delays["hit"] = 1.0
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    assert await cut_off(pair) >= 1
    # Until its lease lapses the broken owner still answers what is forwarded to it, with an
    # error of its own (INTERNAL: "see the server log"); then the other replica runs the runtime.
    retried = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL)
    result = await settled_at(other, runtime_id, handle_id, patience=LEASE * 8, retried=retried)
    assert (result.status, result.text, result.turns) == (pb.STATUS_DONE, "done", 2)


async def test_a_long_wait_and_watch_at_another_replica_follow_the_runtime_when_its_owner_dies(
    pair: Pair, tools: ToolServer
) -> None:
    """A Wait (no timeout) and a Watch at the other replica, forwarded to the owner for longer
    than the retry window (three leases) when the owner is killed: both follow the runtime to
    the replica that takes it over and end with the run's result, rather than an UNAVAILABLE
    for a retry window counted from when the call began."""
    tools.delays["hit"] = 60.0  # the run outlasts the window, until the owner dies
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    waiting = asyncio.ensure_future(other.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=90))
    events: list[pb.Event] = []

    async def watch() -> None:
        async for response in other.Watch(pb.WatchRequest(runtime_id=runtime_id), timeout=90):
            events.append(response.event)
            if response.event.handle_id == handle_id and response.event.HasField("result"):
                return

    watching = asyncio.ensure_future(watch())
    await until(lambda: bool(events), "the Watch to be forwarded", timeout=20)
    await asyncio.sleep(3 * LEASE + 1)  # the calls have been forwarded for longer than the retry window
    assert not waiting.done() and not watching.done()
    tools.delays["hit"] = 0.0  # the call in doubt is quick when it runs again
    await pair.owner.stop(signal.SIGKILL)
    waited = await waiting
    assert (waited.result.status, waited.result.text, waited.result.turns) == (pb.STATUS_DONE, "done", 2)
    await watching
    assert [event.seq for event in events] == list(range(1, len(events) + 1))  # no gap, nothing twice


async def test_a_takeover_waiting_on_a_locked_row_holds_up_no_renewal(pair: Pair, tools: ToolServer) -> None:
    """A takeover's claim waits on the runtime's row for as long as another transaction holds
    it (a replica paused or cut off inside one, a slow database). Meanwhile the replica taking
    over goes on renewing its own leases, or it loses every runtime it runs; once the row is
    free, the takeover completes."""
    tools.delays["hit"] = 60.0
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id, handle_id = await started_run(owner, tools)
    await until(lambda: len(tools.in_flight_keys) == 1, "the tool call in flight at the owner", timeout=20)
    locker, watcher = await asyncpg.connect(pair.database), await asyncpg.connect(pair.database)
    try:
        async with locker.transaction():
            await locker.execute("SELECT 1 FROM runtimes WHERE id = $1 FOR UPDATE", runtime_id)
            await pair.owner.stop(signal.SIGKILL)

            async def claim_waits() -> bool:  # its lease lapses; the other replica's claim then waits on the row
                return bool(
                    await watcher.fetchval(
                        "SELECT COUNT(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE runtimes r SET owner%'"
                    )
                )

            await eventually(claim_waits, "the other replica to claim the dead owner's runtime", timeout=LEASE * 2)
            loop = asyncio.get_running_loop()
            watched_until = loop.time() + 2 * LEASE
            while loop.time() < watched_until:
                left = await watcher.fetchval(
                    "SELECT expires_at - extract(epoch FROM clock_timestamp()) FROM replicas WHERE address = $1",
                    pair.other.address,
                )
                assert left is not None and left > 0, "the replica taking over let its own lease lapse"
                await asyncio.sleep(0.2)
            tools.delays["hit"] = 0.0
    finally:
        await locker.close()
        await watcher.close()
    result = await settled_at(other, runtime_id, handle_id, patience=30)
    assert (result.status, result.text) == (pb.STATUS_DONE, "done")


async def test_a_watch_with_deltas_at_another_replica_streams_the_owners_turns(pair: Pair, model: ScriptedModelServer) -> None:
    """Deltas through a forwarded Watch: the other replica relays the owner's pieces as they
    come, and a watcher cut mid-turn there gets the turn again from index 0."""
    text = "Forwarded pieces arrive at the other replica as the owner reads them from the model."
    model.script("writer", lambda body: Reply(text=text, tokens=20, streamed=Streamed(chunk=8, pause=0.08)))
    owner = await pair.owner.start()
    other = await pair.other.start()
    runtime_id = await create(owner, agent("writer"))
    handle_id = (await owner.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="writer"))).handle_id
    call = other.Watch(pb.WatchRequest(runtime_id=runtime_id, deltas=True), timeout=60)
    first = await anext(aiter(call))  # forwarded and subscribed at the owner: the turn will stream
    assert first.event.HasField("spawned")
    await owner.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="write"))
    cut: list[pb.WatchResponse] = [first]
    async for response in call:
        cut.append(response)
        if len([r for r in cut if r.HasField("delta")]) == 3:
            break
    call.cancel()
    seen = [r.event.seq for r in cut if r.HasField("event")][-1]
    again = await watch_deltas(other, runtime_id, handle_id, after=seen)
    pieces = again.of(handle_id)
    assert [d.index for d in pieces] == list(range(len(pieces))) and len(pieces) == 11
    assert joined(pieces) == text
    assert again.result is not None and again.result.text == text
