"""agentruntime: the Python client of the agentruntime service.

    from agentruntime import AgentRuntimeError, Client, OutputError, SyncClient, output_as

The generated stubs are `agentruntime.v1` (`from agentruntime.v1 import agent_runtime_pb2 as pb`).
Importing them imports this package first, so the client's names are loaded on first use
(PEP 562), not here: a program, or the server, that needs only the stubs never loads the
client, grpc.aio's helpers or msgspec, and the client's own import of the stubs makes no cycle."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import PEM, AgentRuntimeError, Client, ToolHandler
    from .output import OutputError, output_as, output_json
    from .sync import SyncClient

# Each public name and the module that defines it.
_HOMES = {
    "Client": "client",
    "AgentRuntimeError": "client",
    "PEM": "client",
    "ToolHandler": "client",
    "SyncClient": "sync",
    "output_as": "output",
    "output_json": "output",
    "OutputError": "output",
}

__all__ = ["PEM", "AgentRuntimeError", "Client", "OutputError", "SyncClient", "ToolHandler", "output_as", "output_json"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agentruntime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # found once: later reads do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
