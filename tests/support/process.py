"""The server as a real process on a real store file, started, killed and restarted by a test."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import grpc
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT = 30.0  # seconds: a start on a loaded 2-core machine, other replicas busy beside it
RECONNECT_QUICKLY = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 250)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(self, store: Path | str, model_url: str, log: Path, env: dict[str, str] | None = None) -> None:
        """`store`: a SQLite file, or a store URL (postgresql://…); `env`: settings on top."""
        self.store = store
        self.model_url = model_url
        self.log = log
        self.env = env or {}
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None
        self.channel: grpc.aio.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> pb_grpc.AgentRuntimeAsyncStub:
        env = {
            **os.environ,
            "AGENTRUNTIME_STORE": self.store if isinstance(self.store, str) else f"sqlite:///{self.store}",
            "AGENTRUNTIME_LLM_STYLE": "openai",
            "AGENTRUNTIME_LLM_BASE_URL": self.model_url,
            "AGENTRUNTIME_LLM_API_KEY": "sk-test-secret-never-shown",
            "AGENTRUNTIME_SHUTDOWN_GRACE": "5",
            "AGENTRUNTIME_METRICS_LISTEN": "off",
            **self.env,
        }
        started = time.monotonic()
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentruntime_server", "serve", "--listen", self.address,
                env=env, stdout=log, stderr=log,
            )  # fmt: skip
        # A connect refused while the process starts would hold the channel back for grpc's
        # reconnect backoff (a second and more): the test would meet a server well under way.
        self.channel = grpc.aio.insecure_channel(self.address, options=RECONNECT_QUICKLY)
        health = health_pb2_grpc.HealthStub(self.channel)
        # Bounded by time, not by tries: a try refused at once takes 50 ms, one that meets a
        # busy process up to its 1 s timeout.
        while time.monotonic() - started < START_TIMEOUT:
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return pb_grpc.AgentRuntimeStub(self.channel)
            except grpc.aio.AioRpcError:
                pass
            if self.process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        # Whether it exited or still runs: a log with no line of this start says nothing of which
        # (a failover test met one once, its 200 tries of then about 10 s spent).
        state = f"exit code {self.process.returncode}" if self.process.returncode is not None else "still running"
        waited = time.monotonic() - started
        raise AssertionError(f"the server did not start ({state}, after {waited:.1f} s):\n{self.log.read_text()}")

    def send(self, sig: signal.Signals) -> None:
        """Sends the signal now, with no await: the caller can snapshot what was in flight."""
        assert self.process is not None and self.process.returncode is None
        self.process.send_signal(sig)

    async def stop(self, sig: signal.Signals = signal.SIGKILL) -> int:
        assert self.process is not None
        if self.channel is not None:
            await self.channel.close()
        if self.process.returncode is None:
            self.process.send_signal(sig)
        return await asyncio.wait_for(self.process.wait(), timeout=30)

    async def restart(self) -> pb_grpc.AgentRuntimeAsyncStub:
        return await self.start()
