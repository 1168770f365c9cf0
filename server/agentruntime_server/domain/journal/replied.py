"""The step that records a host's call made with a request id and its answer (the runtime's
ReplyBook keeps them: tree.py). Apart from steps.py so that the tree it is kept in needs none of
the other steps."""

from __future__ import annotations

from dataclasses import dataclass

from .events import EventKind


@dataclass(frozen=True)
class Replied:
    """A host's call made with a request id was answered: a repeat of it gets this answer and
    changes nothing (replies.py). Recorded with the call's effect, in one append (one commit).
    `digest` is what the request said; `handle_ids` and `number` are its answer: the handle
    spawned, the handles closed, the inbox size after a Post, whether an Interrupt stopped
    anything. (A Resume's answer is the run it continued: the Answer's id says which.)"""

    request_id: str
    rpc: str
    digest: str
    handle_ids: tuple[str, ...] = ()
    number: int = 0

    def apply(self, tree: object) -> None:
        pass  # kept with the time it was recorded at: replay.apply

    def events(self) -> list[tuple[str, EventKind, dict[str, object]]]:
        return []
