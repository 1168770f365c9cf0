"""A SIGKILL mid-stream: after the restart the turn runs again, and its stream starts with a
`reset` (a UI clears what the lost go at it showed), then the re-run turn's deltas
(docs/streaming.md#resets)."""

from __future__ import annotations

import signal
from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.build import agent, create, spawn
from tests.support.deltas import joined, watch
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.process import ServerProcess
from tests.support.sse import Streamed

TEXT = "Every piece of this reply takes a tenth of a second to arrive, so a kill lands mid-stream."


async def test_a_turn_cut_by_sigkill_streams_again_after_a_reset(tmp_path: Path, model: ScriptedModelServer) -> None:
    model.script("writer", lambda body: Reply(text=TEXT, tokens=40, streamed=Streamed(chunk=6, pause=0.1)))
    # Streams always: after the restart the turn runs again at once, before any watcher is back.
    process = ServerProcess(
        tmp_path / "agentruntime.db", model.base_url, tmp_path / "server.log", {"AGENTRUNTIME_STREAM_REPLIES": "always"}
    )
    try:
        stub = await process.start()
        runtime_id = await create(stub, agent("writer"))
        handle_id = await spawn(stub, runtime_id, "writer")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="write"))
        before = await watch(stub, runtime_id, handle_id, cut_after_deltas=3)
        assert [d.index for d in before.deltas] == [0, 1, 2] and joined(before.deltas) == TEXT[:18]
        seen = before.events[-1].seq

        await process.stop(signal.SIGKILL)
        stub = await process.restart()

        after = await watch(stub, runtime_id, handle_id, after=seen)
        pieces = after.of(handle_id)
        assert pieces[0].WhichOneof("piece") == "reset" and pieces[0].reset.reason == "rerun"
        assert [d.index for d in pieces] == list(range(len(pieces)))
        assert all(d.WhichOneof("piece") == "text" for d in pieces[1:])
        assert joined(before.deltas + pieces) == TEXT  # what a UI shows: the void go cleared, the re-run whole
        assert after.result is not None and (after.result.status, after.result.text, after.result.turns) == (
            pb.STATUS_DONE,
            TEXT,
            1,
        )
        assert model.calls["writer"] == 2
    finally:
        if process.process is not None and process.process.returncode is None:
            await process.stop()
