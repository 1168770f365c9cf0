"""The journal and durability path under review: a step the store did not take is never
shown, and a worker call that never left the process is not in doubt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.domain.model import ToolCall

from tests.support.build import agent, create, spawn
from tests.support.model_server import ScriptedModelServer
from tests.support.servers import serve


async def test_a_step_the_store_refused_is_never_shown_and_the_runtime_is_read_again_from_the_store(
    model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The runtime's row is gone from the file under the server (it stands for any append the
    store refuses: a row deleted, an I/O error, a write fenced): the Spawn's step is applied
    in memory, the append raises. The caller is told to retry, and nothing reads the handle
    the store never got: the next call reads the runtime from the store."""
    store = tmp_path / "agentruntime.db"
    async with serve(
        store=f"sqlite:///{store}", llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test"
    ) as served:
        runtime_id = await create(served.stub, agent("worker"))
        with contextlib.closing(sqlite3.connect(store)) as db:
            db.execute("DELETE FROM runtimes WHERE id = ?", (runtime_id,))
            db.commit()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="worker"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as listed:
            await served.stub.List(pb.ListRequest(runtime_id=runtime_id))
        assert listed.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_refusal_that_tells_of_another_calls_write_leaves_only_once_that_write_is_committed(
    model: ScriptedModelServer, database: str
) -> None:
    """A lock on the runtime's row holds the Close's step back in the group commit. A Post to
    the handle is refused because it is closed: that answer tells of the Close's write, so it
    leaves only once the write is committed (as every other answer does), never while a crash
    could still lose it."""
    async with serve(store=database, llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test") as served:
        runtime_id = await create(served.stub, agent("worker"))
        handle_id = await spawn(served.stub, runtime_id, "worker")
        admin = await asyncpg.connect(database)
        try:
            lock = admin.transaction()
            await lock.start()
            await admin.execute("SELECT 1 FROM runtimes WHERE id = $1 FOR UPDATE", runtime_id)
            closing = asyncio.ensure_future(served.stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id)))
            await asyncio.sleep(0.3)
            posting = asyncio.ensure_future(
                served.stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="hi"))
            )
            await asyncio.sleep(0.5)
            assert not closing.done() and not posting.done()
            await lock.rollback()
            assert list((await asyncio.wait_for(closing, 10)).closed_handle_ids) == [handle_id]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(posting, 10)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await admin.close()


async def test_create_runtime_with_options_answers_only_once_its_options_are_journaled(
    model: ScriptedModelServer, database: str
) -> None:
    """The runtime's row is inserted on its own; its options are a journal step, written by the
    group commit. A lock on the journal holds that commit back: no answer leaves meanwhile, so
    a crash right after the answer cannot leave a runtime without its options (a generated id:
    the answer names no runtime the edge could flush by)."""
    async with serve(store=database, llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test") as served:
        admin = await asyncpg.connect(database)
        try:
            lock = admin.transaction()
            await lock.start()
            await admin.execute("LOCK TABLE journal IN EXCLUSIVE MODE")
            request = pb.CreateRuntimeRequest(agents=[agent("worker")], options=pb.RuntimeOptions(inbox_capacity=2))
            creating = asyncio.ensure_future(served.stub.CreateRuntime(request))
            await asyncio.sleep(0.5)
            assert not creating.done()
            await lock.rollback()
            runtime_id = (await asyncio.wait_for(creating, 10)).runtime_id
            steps = await admin.fetch("SELECT step FROM journal WHERE runtime_id = $1", runtime_id)
            assert [json.loads(row["step"])["k"] for row in steps] == ["Configured"]
        finally:
            await admin.close()


CHARGE = ToolCall(id="call_1", name="charge", arguments_json="{}")
KEY = "rt/root/payer.1/call_1"
