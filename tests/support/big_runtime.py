"""A runtime with a long history, built the way a host would make one: a lead delegates to
FAN managers through the `task` tool, each manager to FAN workers, every model the embedded
scripted one (no HTTP). With FAN = 55: 3,081 handles and about 24,700 events, 8 a handle
(spawned, running, a turn started and ended, a result and idle; and the parent's task call
started and ended), as the runtime of issue 41's red team (3,031 handles, 24,308 events).
Built once on a SQLite file by a server in the test's process, then served from that file by
a server process of its own, so that what a test measures of that process is not the build's."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

from agentruntime.v1 import agent_runtime_pb2 as pb

from tests.support.tenants import ACME, Caller, tenant_server

FAN = 55


def _delegating(name: str, child: str, fan: int) -> pb.AgentDef:
    calls = [
        pb.ScriptedToolCall(name="task", arguments_json=json.dumps({"agent": child, "prompt": f"part {part}"}))
        for part in range(fan)
    ]
    replies = [pb.ScriptedReply(tool_calls=calls, tokens=20), pb.ScriptedReply(text=f"all {fan} parts done", tokens=10)]
    return pb.AgentDef(
        name=name, description=f"splits the work among {fan} {child}s", team=[child], script=pb.Script(replies=replies)
    )


WORKER = pb.AgentDef(
    name="worker", description="does one part", script=pb.Script(replies=[pb.ScriptedReply(text="part done", tokens=5)])
)


async def build(folder: Path, runtime_id: str = "big", fan: int = FAN) -> tuple[int, int]:
    """Acme's runtime `runtime_id` in folder/store.db (tokens in folder/tokens.json), run to
    its end; returns (its handles, its last event's seq)."""
    agents = [_delegating("lead", "manager", fan), _delegating("manager", "worker", fan), WORKER]
    # The quotas that pace a tenant (handles a minute, running handles) are off: the build takes seconds, not minutes.
    async with tenant_server(folder, quota_handles_per_minute=0, quota_running_handles=0) as served:
        acme = Caller(served.stub, ACME)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=agents))
        _, result = await acme.run(runtime_id, "lead", "go")
        assert result.status == pb.STATUS_DONE, result
        handles = (await acme.runtimes())[runtime_id].handle_count
    with contextlib.closing(sqlite3.connect(folder / "store.db")) as db:
        (last,) = db.execute("SELECT max(last_event) FROM journal WHERE runtime_id = ?", (f"acme:{runtime_id}",)).fetchone()
    return handles, last
