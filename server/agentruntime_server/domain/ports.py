"""The seams the domain calls through: models, tools, persistence. Implementations live
in providers/, tools/ and store/; the domain never imports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .model import AgentSpec, HandleSnapshot, HttpExecutor, Message, ToolCall, ToolResult


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


class HttpToolRunner(Protocol):
    async def run(self, executor: HttpExecutor, arguments_json: str, idempotency_key: str) -> ToolResult: ...


class Store(Protocol):
    """Where the runtime writes what it acknowledges. Every model reply and tool result is
    recorded before the runtime acts on it; each method is one atomic write."""

    async def create_runtime(self, runtime_id: str, agents: tuple[AgentSpec, ...]) -> None: ...

    async def save_handle(self, runtime_id: str, snapshot: HandleSnapshot) -> None: ...

    async def append_message(self, runtime_id: str, handle_id: str, message: Message) -> None: ...

    async def record_model_reply(
        self, runtime_id: str, handle_id: str, message: Message, tokens: int, rolled_up_to: tuple[str, ...]
    ) -> None:
        """The assistant message, the handle's turn and own spend, and `tokens` added to the
        total of the handle and of every id in `rolled_up_to` (its ancestors)."""
        ...

    async def record_tool_result(
        self, runtime_id: str, handle_id: str, call_id: str, result: ToolResult, rolled_up_to: tuple[str, ...]
    ) -> None: ...

    async def record_approval(self, runtime_id: str, handle_id: str, call_id: str) -> None:
        """The host approved this call: it runs (once) when the turn is re-entered."""
        ...

    async def truncate_transcript(self, runtime_id: str, handle_id: str, length: int) -> None: ...
