"""What a replay answers its tool calls with, and makes again: a recorded runtime's top-level
runs and its tool calls' results (forks.Replaying journals it; runs/tool_phase.py asks it)."""

from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary import Budget, Message, RecordedCall, TaskResult, ToolCall, UnrecordedCalls
from .handle import Handle


@dataclass(frozen=True)
class ReplayRoot:
    """A top-level handle of a recording, as a replay makes it again: spawned as it was, its
    runs started on the recorded messages, and what the recording says it came to."""

    handle_id: str
    agent: str
    budget: Budget
    number: int
    messages: tuple[Message, ...]
    recorded: TaskResult | None
    calls: tuple[tuple[str, str, str], ...]  # its subtree's tool calls: (handle id, name, arguments)


@dataclass(frozen=True)
class Recording:
    """The recorded runtime (its id), what a call it has no result for gets, the recorded
    calls with their results, and the roots to make again."""

    source: str
    unrecorded: UnrecordedCalls
    calls: tuple[RecordedCall, ...] = ()
    roots: tuple[ReplayRoot, ...] = ()

    def answer(self, handle: Handle, call: ToolCall) -> RecordedCall | None:
        """The recorded call this one matches, if any: the same handle, place, name and arguments."""
        place = call_place(handle, call.id)
        for recorded in self.calls:
            if recorded.handle_id == handle.id and recorded.place == place:
                return recorded if recorded.name == call.name and recorded.arguments_json == call.arguments_json else None
        return None


def call_place(handle: Handle, call_id: str) -> int:
    """The call's index among the handle's tool calls, in its transcript's order (-1: none)."""
    place = 0
    for message in handle.transcript:
        for call in message.tool_calls:
            if call.id == call_id:
                return place
            place += 1
    return -1
