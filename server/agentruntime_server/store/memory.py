"""`memory://`: the store kept in dicts, for tests. Nothing survives the process."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from ..domain.events import Event
from ..domain.model import AgentSpec, Answer, HandleRecord, Message, RuntimeRecord, ToolResult
from ..domain.ports import Figures


@dataclass
class _Runtime:
    agents: tuple[AgentSpec, ...]
    handles: dict[str, HandleRecord] = field(default_factory=dict)
    transcripts: dict[str, list[Message]] = field(default_factory=lambda: defaultdict(list))
    tool_results: dict[str, dict[str, ToolResult]] = field(default_factory=lambda: defaultdict(dict))
    started_calls: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    answered: dict[str, tuple[Answer, str]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


class MemoryStore:
    durable = False

    def __init__(self) -> None:
        self._runtimes: dict[str, _Runtime] = {}

    async def create_runtime(self, runtime_id: str, agents: tuple[AgentSpec, ...]) -> None:
        self._runtimes[runtime_id] = _Runtime(agents)

    async def runtime_exists(self, runtime_id: str) -> bool:
        return runtime_id in self._runtimes

    async def save_handles(self, runtime_id: str, records: list[HandleRecord]) -> None:
        handles = self._runtimes[runtime_id].handles
        for record in records:
            handles[record.handle_id] = record

    async def append_messages(
        self, runtime_id: str, handle_id: str, start: int, messages: list[Message], record: HandleRecord | None = None
    ) -> None:
        runtime = self._runtimes[runtime_id]
        transcript = runtime.transcripts[handle_id]
        del transcript[start:]
        transcript.extend(messages)
        if record is not None:
            runtime.handles[handle_id] = record

    async def truncate_transcript(self, runtime_id: str, handle_id: str, length: int) -> None:
        del self._runtimes[runtime_id].transcripts[handle_id][length:]

    async def record_model_reply(
        self, runtime_id: str, handle_id: str, index: int, message: Message, figures: list[Figures]
    ) -> None:
        await self.append_messages(runtime_id, handle_id, index, [message])
        self._update(runtime_id, figures)

    def _update(self, runtime_id: str, figures: list[Figures]) -> None:
        handles = self._runtimes[runtime_id].handles
        for handle_id, turns, own, total, calls, subtree_calls in figures:
            handles[handle_id] = replace(
                handles[handle_id],
                turns=turns,
                own_tokens=own,
                total_tokens=total,
                tool_calls=calls,
                subtree_tool_calls=subtree_calls,
            )

    async def record_call_started(self, runtime_id: str, handle_id: str, call_id: str) -> None:
        self._runtimes[runtime_id].started_calls[handle_id].add(call_id)

    async def record_tool_result(
        self, runtime_id: str, handle_id: str, call_id: str, result: ToolResult, figures: list[Figures]
    ) -> None:
        self._runtimes[runtime_id].tool_results[handle_id][call_id] = result
        self._runtimes[runtime_id].started_calls[handle_id].discard(call_id)
        self._update(runtime_id, figures)

    async def record_answer(self, runtime_id: str, request_id: str, answer: Answer, leaf_id: str) -> None:
        self._runtimes[runtime_id].answered[request_id] = (answer, leaf_id)

    async def append_event(self, runtime_id: str, event: Event) -> None:
        self._runtimes[runtime_id].events.append(event)

    async def events_after(self, runtime_id: str, after_seq: int) -> list[Event]:
        events = self._runtimes[runtime_id].events
        return events[after_seq:]  # seq n is at index n - 1: numbered without gaps

    async def load_runtime(self, runtime_id: str) -> RuntimeRecord | None:
        runtime = self._runtimes.get(runtime_id)
        if runtime is None:
            return None
        return RuntimeRecord(
            runtime_id=runtime_id,
            agents=runtime.agents,
            handles=sorted(runtime.handles.values(), key=lambda record: record.seq),
            transcripts={key: list(value) for key, value in runtime.transcripts.items()},
            tool_results={key: dict(value) for key, value in runtime.tool_results.items()},
            started_calls={key: set(value) for key, value in runtime.started_calls.items()},
            answered=dict(runtime.answered),
            last_event_seq=len(runtime.events),
        )

    async def runtimes_with_running_handles(self) -> list[str]:
        return []  # nothing outlives the process

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        self._runtimes.clear()
