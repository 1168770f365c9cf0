"""The Python client and CLI over a long outage and hostile text: a worker that keeps
reconnecting however long the server is away, and a terminal that model output cannot
drive."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import json_format

from tests.clients.test_cli import cli
from tests.support.process import free_port
from tests.support.servers import serve

HOSTILE = "done\x1b]0;owned\x07\x1b[2J\x9b31m"


async def test_a_worker_keeps_reconnecting_through_a_long_outage() -> None:
    port = free_port()
    drops = 0

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal drops
            drops += 1

    counter = Counter()
    worker_log = logging.getLogger("agentruntime.worker")
    worker_log.addHandler(counter)
    registered = asyncio.Event()
    try:
        async with Client(f"127.0.0.1:{port}") as client:
            # No wait between attempts: the failures of a long outage, in a moment.
            serving = asyncio.ensure_future(
                client.serve_tools(
                    "q", {"t": lambda arguments, call: "x"}, max_backoff=0.0, registered=lambda _: registered.set()
                )
            )
            for _ in range(3000):
                if drops > 1100 or serving.done():
                    break
                await asyncio.sleep(0.01)
            # The 1024th failure used to raise OverflowError (2**1024 as a float) and end the worker.
            assert not serving.done(), serving.exception()
            assert drops > 1100
            async with serve(listen=f"127.0.0.1:{port}"):
                await asyncio.wait_for(registered.wait(), 30)
            serving.cancel()
    finally:
        worker_log.removeHandler(counter)


async def test_the_cli_prints_no_terminal_control_from_model_text(tmp_path: Path) -> None:
    scripted = pb.AgentDef(name="echo", description="says it", script=pb.Script(replies=[pb.ScriptedReply(text=HOSTILE)]))
    agents = tmp_path / "agents.json"
    agents.write_text(json_format.MessageToJson(pb.CreateRuntimeRequest(runtime_id="hostile", agents=[scripted])))
    async with serve() as served:
        code, ran, _ = await cli(served.running, "run", str(agents), "--runtime-id", "hostile", "--prompt", "go")
        assert code == 0, ran
        _, shown, _ = await cli(served.running, "transcript", "hostile", "root/echo.1")
    for out in (ran, shown):
        assert "owned" in out  # the text is shown, its control characters escaped
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, out


async def test_a_watch_allowed_many_retries_waits_a_bounded_time_between_them() -> None:
    """max_retries is the caller's; the wait between reconnects doubles only up to a cap, so
    a large max_retries neither waits for ages nor overflows (2**1024 is no float)."""
    port = free_port()
    async with Client(f"127.0.0.1:{port}") as client:
        watching = client.watch("rt", max_retries=1100, backoff=1e-300).__anext__()
        try:
            await asyncio.wait_for(watching, 60)
        except Exception as error:  # every reconnect refused: after the last, the UNAVAILABLE
            assert type(error).__name__ == "AgentRuntimeError", error
            assert "UNAVAILABLE" in str(error) or "failed to connect" in str(error), error
