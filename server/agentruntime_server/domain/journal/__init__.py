"""The journal: every change to a runtime is one step, a value that is applied to the
in-memory tree and appended to the store together (`Journal.record`, record.py). Restoring a
runtime from the store is `replay` (replay.py): the same steps applied again, in order, to an
empty tree (tree.py).

Steps (steps.py, imported.py) are facts, never commands: applying one cannot fail and does
no I/O. The store keeps them versioned (store/payloads.py), so a store written by an older
release replays in a newer one. Each step also names the events a watcher sees
(`events_of`, entry.py): events are derived from steps, never written on their own.

Only record.py reaches outside, through the store and the event log it is handed; the rest
imports nothing that does I/O."""

from .entry import Entry, events_of
from .events import Event, EventKind
from .forks import Forked, Held, Replaying, Rewound
from .imported import EventsImported, Imported
from .record import EventSink, Journal, JournalStore
from .replay import apply, replay
from .replied import Replied
from .steps import (
    HEARTBEAT_KEY,
    OUTPUT_PREVIEW,
    STEPS,
    Answered,
    BudgetSet,
    CallFinished,
    CallStarted,
    CallSuspended,
    Closed,
    Compacted,
    Configured,
    InDoubt,
    MessagesAppended,
    ModelReplied,
    Posted,
    Queued,
    RunStarted,
    Settled,
    Spawned,
    Step,
    Ticked,
    TurnStarted,
)
from .tree import ReplyBook, Tree

__all__ = [
    "HEARTBEAT_KEY",
    "OUTPUT_PREVIEW",
    "STEPS",
    "Answered",
    "BudgetSet",
    "CallFinished",
    "CallStarted",
    "CallSuspended",
    "Closed",
    "Compacted",
    "Configured",
    "Entry",
    "Event",
    "EventKind",
    "EventSink",
    "EventsImported",
    "Forked",
    "Held",
    "Imported",
    "InDoubt",
    "Journal",
    "JournalStore",
    "MessagesAppended",
    "ModelReplied",
    "Posted",
    "Queued",
    "Replaying",
    "Replied",
    "ReplyBook",
    "Rewound",
    "RunStarted",
    "Settled",
    "Spawned",
    "Step",
    "Ticked",
    "Tree",
    "TurnStarted",
    "apply",
    "events_of",
    "replay",
]
