"""The in-memory store: the journal kept in dicts, for tests and `memory://`. Lost on exit."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..domain.model import AgentSpec, HandleSnapshot, Message, ToolResult


@dataclass
class HandleRow:
    snapshot: HandleSnapshot | None = None
    transcript: list[Message] = field(default_factory=list)
    tool_results: dict[str, ToolResult] = field(default_factory=dict)
    turns: int = 0
    own_tokens: int = 0
    total_tokens: int = 0
    tool_calls: int = 0
    approved: set[str] = field(default_factory=set)


class MemoryStore:
    def __init__(self) -> None:
        self.runtimes: dict[str, tuple[AgentSpec, ...]] = {}
        self.handles: dict[tuple[str, str], HandleRow] = defaultdict(HandleRow)

    async def create_runtime(self, runtime_id: str, agents: tuple[AgentSpec, ...]) -> None:
        self.runtimes[runtime_id] = agents

    async def save_handle(self, runtime_id: str, snapshot: HandleSnapshot) -> None:
        self.handles[runtime_id, snapshot.handle_id].snapshot = snapshot

    async def append_message(self, runtime_id: str, handle_id: str, message: Message) -> None:
        self.handles[runtime_id, handle_id].transcript.append(message)

    async def record_model_reply(
        self, runtime_id: str, handle_id: str, message: Message, tokens: int, rolled_up_to: tuple[str, ...]
    ) -> None:
        row = self.handles[runtime_id, handle_id]
        row.transcript.append(message)
        row.turns = message.turn
        row.own_tokens += tokens
        row.total_tokens += tokens
        for ancestor in rolled_up_to:
            self.handles[runtime_id, ancestor].total_tokens += tokens

    async def record_tool_result(
        self, runtime_id: str, handle_id: str, call_id: str, result: ToolResult, rolled_up_to: tuple[str, ...]
    ) -> None:
        row = self.handles[runtime_id, handle_id]
        row.tool_results[call_id] = result
        row.tool_calls += 1

    async def record_approval(self, runtime_id: str, handle_id: str, call_id: str) -> None:
        self.handles[runtime_id, handle_id].approved.add(call_id)

    async def truncate_transcript(self, runtime_id: str, handle_id: str, length: int) -> None:
        del self.handles[runtime_id, handle_id].transcript[length:]
