"""Retention (AGENTRUNTIME_RETENTION) against runtimes used while its pass runs. A pass lists
the idle runtimes once, then deletes them one at a time; on PostgreSQL every delete is a
round trip, so calls come in between. A runtime written after the listing (an acknowledged
Spawn) must be kept: the store deletes a runtime only if it is still idle, in one step."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, create
from tests.support.model_server import ScriptedModelServer
from tests.support.poll import until
from tests.support.process import ServerProcess

RETENTION = 3.0  # seconds: well over the time the test spawns and checks in
RUNTIMES = 1000  # a pass over them all takes a while: the Spawns below land during it


async def test_a_runtime_spawned_in_during_a_retention_pass_is_kept(
    database: str, tmp_path: Path, model: ScriptedModelServer
) -> None:
    process = ServerProcess(database, model.base_url, tmp_path / "server.log", env={"AGENTRUNTIME_RETENTION": str(RETENTION)})
    stub = await process.start()
    try:
        ids = [f"r{n:04d}" for n in range(RUNTIMES)]
        for start in range(0, RUNTIMES, 50):
            await asyncio.gather(*(create(stub, agent("a"), runtime_id=runtime_id) for runtime_id in ids[start : start + 50]))
        # Down for longer than the retention: the first pass after the restart lists them all at once.
        await process.stop(signal.SIGTERM)
        await asyncio.sleep(RETENTION + 0.2)
        logged = process.log.stat().st_size
        stub = await process.restart()

        async def stored() -> int:
            listed = await stub.ListRuntimes(pb.ListRuntimesRequest(page_size=RUNTIMES))
            return len(listed.runtimes)

        # Once one is gone, the pass is under way. Watched with ListRuntimes, a read of the store:
        # a List would load the runtime, and the pass keeps one that a call is loading (it was
        # flaky so: the pass skipped ids[0], went on to the end, and the Spawns came too late).
        for _ in range(1000):
            if await stored() < RUNTIMES:
                break
            await asyncio.sleep(0.005)
        # From the other end, until the Spawns meet the pass: every Spawn acknowledged before
        # that wrote to a runtime the pass has listed, and has yet to get to.
        spawned: list[str] = []
        for runtime_id in reversed(ids):
            try:
                await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="a"), timeout=10)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.NOT_FOUND, error
                break
            spawned.append(runtime_id)
        assert spawned, "the pass was over before the first Spawn: more RUNTIMES"

        await until(lambda: b"retention deleted" in process.log.read_bytes()[logged:], "the end of the pass")
        listed = await stub.ListRuntimes(pb.ListRuntimesRequest(page_size=RUNTIMES))
        remaining = {summary.runtime_id for summary in listed.runtimes}
        assert remaining == set(spawned), f"{len(set(spawned) - remaining)} of {len(spawned)} spawned runtimes deleted"
        for runtime_id in spawned:
            handles = await stub.List(pb.ListRequest(runtime_id=runtime_id))
            assert [handle.handle_id for handle in handles.handles] == ["root/a.1"], runtime_id
    finally:
        await process.stop()
