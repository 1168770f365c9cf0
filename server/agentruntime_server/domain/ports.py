"""The seams the domain calls through: models, tools, persistence. Implementations live
in providers/, tools/ and store/; the domain never imports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .events import Event
from .model import AgentSpec, Answer, HandleRecord, HttpExecutor, Message, RuntimeRecord, ToolCall, ToolResult


class ProviderError(Exception):
    """A model call failed; the run settles ERROR with this message (never a secret)."""


@dataclass(frozen=True)
class ToolSchema:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    agent: AgentSpec
    messages: tuple[Message, ...]  # the system prompt first when the agent has instructions
    tools: tuple[ToolSchema, ...]


@dataclass(frozen=True)
class ModelReply:
    text: str
    tool_calls: tuple[ToolCall, ...]  # ids are the provider's; the domain assigns its own
    tokens: int


class ModelProvider(Protocol):
    async def complete(self, request: ModelRequest) -> ModelReply: ...


class ModelRouter(ModelProvider, Protocol):
    """The provider the runtime calls: it routes each agent to a named provider."""

    @property
    def names(self) -> frozenset[str]:
        """Every provider name an AgentDef may give."""
        ...


class HttpToolRunner(Protocol):
    async def run(self, executor: HttpExecutor, arguments_json: str, idempotency_key: str) -> ToolResult: ...


# (handle id, turns, own_tokens, total_tokens, tool_calls, subtree_tool_calls): what a
# journal step changes on the handle that made it and on each of its ancestors.
Figures = tuple[str, int, int, int, int, int]


class Store(Protocol):
    """Where the runtime writes what it acknowledges; the source of truth after a restart.

    Every method is one atomic write (or read). Model replies and tool results are
    recorded before the runtime acts on them, together with the usage roll-up they imply.
    """

    durable: bool  # False: nothing survives the process, so nothing is evicted from memory

    async def create_runtime(self, runtime_id: str, agents: tuple[AgentSpec, ...]) -> None: ...

    async def runtime_exists(self, runtime_id: str) -> bool: ...

    async def save_handles(self, runtime_id: str, records: list[HandleRecord]) -> None: ...

    async def append_messages(
        self, runtime_id: str, handle_id: str, start: int, messages: list[Message], record: HandleRecord | None = None
    ) -> None:
        """Transcript entries start..start+len-1, with the handle's row when it changed too."""
        ...

    async def truncate_transcript(self, runtime_id: str, handle_id: str, length: int) -> None: ...

    async def record_model_reply(
        self, runtime_id: str, handle_id: str, index: int, message: Message, figures: list[Figures]
    ) -> None:
        """The assistant message at `index` with the new figures of the handle and its ancestors."""
        ...

    async def record_call_started(self, runtime_id: str, handle_id: str, call_id: str) -> None:
        """A side-effecting call is about to run: after a crash without its result, it is in doubt."""
        ...

    async def record_tool_result(
        self, runtime_id: str, handle_id: str, call_id: str, result: ToolResult, figures: list[Figures]
    ) -> None:
        """The result with the new figures of the handle and its ancestors."""
        ...

    async def record_answer(self, runtime_id: str, request_id: str, answer: Answer, leaf_id: str) -> None: ...

    async def append_event(self, runtime_id: str, event: Event) -> None: ...

    async def events_after(self, runtime_id: str, after_seq: int) -> list[Event]: ...

    async def load_runtime(self, runtime_id: str) -> RuntimeRecord | None: ...

    async def runtimes_with_running_handles(self) -> list[str]: ...

    async def flush(self) -> None:
        """Makes every write so far durable now (before an acknowledgement leaves the process)."""
        ...

    async def close(self) -> None: ...
