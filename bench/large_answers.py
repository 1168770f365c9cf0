"""A large typed answer: how long the server's event loop is held while it is judged, recorded and
sent. A model answers 1 MiB of JSON (30,000 objects) to an output schema; the longest stretch of
the loop thread's CPU time between two turns of a 5 ms ticker is read while the answer is settled,
waited for and watched (tests/support/loop_held.py). The model server and the client share the
loop (an in-process server, as in the tests); the reply's text is made before the measure.
Figures are measured, never asserted: the median and the range of several runs, and what the same
answer's conversion to a Value costs when made on the loop (the step api/values.py moves off it)."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentruntime_server.api import values
from agentruntime_server.process.event_loop import DEFAULT_LOOP, loop_factory

from tests.support.build import create
from tests.support.calls import events_until, is_result_of
from tests.support.loop_held import loop_held
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.servers import serve

RUNS = 7
LARGE = {"rows": [{"k": index, "s": "abc", "f": index * 0.5} for index in range(30_000)]}


async def held_once(model: ScriptedModelServer) -> float:
    definition = pb.AgentDef(name="typed", description="answers in JSON", model="typed")
    definition.output_schema.update({"type": "object"})
    settings: dict[str, Any] = {"llm_style": "openai", "llm_base_url": model.base_url, "llm_api_key": "sk-bench"}
    async with serve(max_model_reply_bytes=2 << 20, **settings) as served:
        runtime_id = await create(served.stub, definition)
        async with loop_held() as held:
            spawned = await served.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="typed"))
            handle_id = spawned.handle_id
            await served.stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="answer"))
            waited = await served.stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=60)
            await events_until(served.stub, runtime_id, is_result_of(handle_id))
        assert waited.result.status == pb.STATUS_DONE, waited.result
    return held.longest


async def main() -> None:
    text = json.dumps(LARGE)
    model = ScriptedModelServer()
    await model.start()
    model.script("typed", lambda body: Reply(text=text, tokens=10))
    try:
        held = [await held_once(model) for _ in range(RUNS)]
    finally:
        await model.stop()
    on_loop = []
    for _ in range(RUNS):
        started = time.thread_time()
        values._converted(LARGE)
        on_loop.append(time.thread_time() - started)
    print(f"large typed answer: {len(text) / 1024:.0f} KiB of JSON, {len(LARGE['rows'])} objects, {RUNS} runs")
    print(
        f"  loop held (longest CPU stretch while settled, waited, watched): median {statistics.median(held) * 1000:.0f} ms"
        f" (range {min(held) * 1000:.0f}-{max(held) * 1000:.0f})"
    )
    print(f"  its conversion to a Value alone, were it made on the loop: median {statistics.median(on_loop) * 1000:.0f} ms")


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=loop_factory(DEFAULT_LOOP)) as runner:
        runner.run(main())
