from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from agentruntime_server.process.event_loop import DEFAULT_LOOP, LoopFactory, loop_factory

from tests.support.forking import keep_the_collector_out_of_forks

if TYPE_CHECKING:  # the fixtures import what they start when they start it: the fast tier (tests/domain) imports no server
    from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
    from agentruntime_server.app import RunningServer

    from tests.support.anthropic_server import ScriptedAnthropicServer
    from tests.support.model_server import ScriptedModelServer
    from tests.support.process import ServerProcess
    from tests.support.servers import Served
    from tests.support.tool_server import ToolServer

# A hung test fails with its name, on uvloop too (pytest-timeout with tests/support/timeouts.py).
pytest_plugins = ["tests.support.timeouts"]

keep_the_collector_out_of_forks()  # a child uvloop forks never collects before its exec (tests/support/forking.py)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, LoopFactory]:
    """Every test runs on the event loop a server runs on by default (uvloop)."""
    return {DEFAULT_LOOP: loop_factory(DEFAULT_LOOP)}


@pytest.fixture
async def model() -> AsyncIterator[ScriptedModelServer]:
    from tests.support.model_server import ScriptedModelServer

    server = ScriptedModelServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def anthropic() -> AsyncIterator[ScriptedAnthropicServer]:
    from tests.support.anthropic_server import ScriptedAnthropicServer

    server = ScriptedAnthropicServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def tools() -> AsyncIterator[ToolServer]:
    from tests.support.tool_server import ToolServer

    server = ToolServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def served(model: ScriptedModelServer) -> AsyncIterator[Served]:
    from tests.support.servers import serve

    async with serve(
        llm_style="openai",
        llm_base_url=model.base_url,
        llm_api_key="sk-test-secret-never-shown",
        inbox_capacity=3,
    ) as served:
        yield served


@pytest.fixture
def server(served: Served) -> RunningServer:
    return served.running


@pytest.fixture
def stub(served: Served) -> pb_grpc.AgentRuntimeAsyncStub:
    return served.stub


@pytest.fixture
async def process(tmp_path: Path, model: ScriptedModelServer) -> AsyncIterator[ServerProcess]:
    """A server in a process of its own (SQLite store, the scripted model), for tests that kill it."""
    from tests.support.process import ServerProcess

    server = ServerProcess(tmp_path / "store" / "agentruntime.db", model.base_url, tmp_path / "server.log")
    yield server
    if server.process is not None and server.process.returncode is None:
        await server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """One PostgreSQL server for the session; each test keeps its tables in a schema or a
    database of its own."""
    from tests.support.postgres import POSTGRES, embedded_postgres

    with embedded_postgres() as url:
        POSTGRES["url"] = url
        try:
            yield url
        finally:
            POSTGRES.clear()


@pytest.fixture
async def database(postgres: str, tmp_path: Path) -> str:
    """The URL of a database of the test's own on the session's PostgreSQL server."""
    from tests.support.postgres import fresh_database

    return await fresh_database(postgres, tmp_path.name)
