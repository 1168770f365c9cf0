from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import RunningServer, start
from agentruntime_server.settings import Settings

from tests.support.model_server import ScriptedModelServer
from tests.support.tool_server import ToolServer


@pytest.fixture
async def model() -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def tools() -> AsyncIterator[ToolServer]:
    server = ToolServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def server(model: ScriptedModelServer) -> AsyncIterator[RunningServer]:
    settings = Settings(
        listen="127.0.0.1:0",
        llm_style="openai",
        llm_base_url=model.base_url,
        llm_api_key="sk-test-secret-never-shown",
        inbox_capacity=3,
        metrics_listen="off",
        store="memory://",
    )
    running = await start(settings)
    yield running
    await running.stop(grace=None)


@pytest.fixture
async def stub(server: RunningServer) -> AsyncIterator[pb_grpc.AgentRuntimeStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield pb_grpc.AgentRuntimeStub(channel)
