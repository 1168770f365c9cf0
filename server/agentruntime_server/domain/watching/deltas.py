"""Pieces of model replies as they stream in (Watch's deltas, docs/streaming.md).

Deltas are not journaled: the whole reply is, as before. The pieces of every turn in
progress are kept in memory (bounded) so that a watcher reconnecting mid-turn gets the
turn again from index 0; a turn's pieces are dropped once its reply is journaled."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

# A turn keeps (and sends) at most this many pieces: past it, watchers have the turn's
# whole reply from its TurnEnded event. A provider's reply body is capped anyway
# (CallPolicy.max_reply_bytes); this caps the pieces a body of tiny events makes.
MAX_TURN_DELTAS = 10_000


class DeltaKind(enum.Enum):
    TEXT = "text"
    THINKING = "thinking"
    TOOL_CALL = "tool_call"
    RESET = "reset"


@dataclass(frozen=True, slots=True)
class Delta:
    handle_id: str
    turn: int
    index: int  # in the turn's stream since it (re)started, from 0
    after_seq: int  # the runtime's last event when it was made
    kind: DeltaKind
    text: str = ""  # the piece (a tool call's arguments), or a reset's reason
    call_index: int = 0  # TOOL_CALL: the call's place in the reply
    name: str = ""  # TOOL_CALL: the tool's name, in the call's first piece
    attempt: int = 0  # which start of the turn's stream (not sent: it tells a repeat from a reset)


class DeltaHub(Protocol):
    """Where a turn's pieces go (the runtime's EventLog)."""

    @property
    def last_seq(self) -> int: ...

    def publish_delta(self, delta: Delta) -> None: ...

    def end_stream(self, stream: TurnStream) -> None: ...


class TurnStream:
    """One model turn's stream: numbers its pieces, keeps them for watchers that reconnect,
    and hands them to the watchers that asked for deltas. A `ports.ReplyStream`."""

    __slots__ = ("_hub", "attempt", "handle_id", "pieces", "turn")

    def __init__(self, hub: DeltaHub, handle_id: str, turn: int) -> None:
        self._hub = hub
        self.handle_id = handle_id
        self.turn = turn
        self.attempt = 0
        self.pieces: list[Delta] = []

    @property
    def streamed(self) -> bool:
        return bool(self.pieces)

    def text(self, piece: str) -> None:
        if piece:
            self._add(DeltaKind.TEXT, piece)

    def thinking(self, piece: str) -> None:
        if piece:
            self._add(DeltaKind.THINKING, piece)

    def tool_call(self, index: int, name: str, arguments: str) -> None:
        if name or arguments:
            self._add(DeltaKind.TOOL_CALL, arguments, index, name)

    def restart(self, reason: str) -> None:
        """A reset: index 0 of the turn's stream started again."""
        self.attempt += 1
        self.pieces = []
        self._add(DeltaKind.RESET, reason)

    def close(self) -> None:
        """The turn's reply is journaled (or the turn ended without one): its pieces go."""
        self._hub.end_stream(self)

    def _add(self, kind: DeltaKind, text: str, call_index: int = 0, name: str = "") -> None:
        pieces = self.pieces
        if len(pieces) >= MAX_TURN_DELTAS:
            return
        delta = Delta(self.handle_id, self.turn, len(pieces), self._hub.last_seq, kind, text, call_index, name, self.attempt)
        pieces.append(delta)
        self._hub.publish_delta(delta)
