"""A fork: a new runtime whose journal is a copy of another's up to one event (the cut), then
the fork's own steps (forks.Forked and the changes asked for). Building one replays the copy
and records nothing anywhere: the service stores the fork whole, in one write, or nothing.
docs/fork-and-replay.md"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..definitions.validation import check_text_size
from ..errors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound, OutOfRange
from ..journal import Entry, Forked, Held, Journal, Rewound, Step
from ..journal.handle import Handle
from ..ports import Services, StoredRuntime
from ..runs import budgets
from ..suspension.answers import read_answer
from ..vocabulary import AgentSpec, Answer, HandleState, InboxItem
from .resumes import answered_steps, declined_steps
from .runtime import Runtime


@dataclass(frozen=True)
class ForkChanges:
    """What a fork changes at its cut (each a step of the fork's journal)."""

    agents: tuple[AgentSpec, ...] = ()  # replacements, by name (a new name is added)
    messages: tuple[tuple[str, str], ...] = ()  # (handle id, text): its last user message replaced
    answers: tuple[Answer, ...] = ()  # Requests pending at the cut, answered


def cut(stored: StoredRuntime, at_seq: int) -> tuple[list[Entry], int]:
    """The source's journal up to the step that made event `at_seq`, and that step's last event."""
    if at_seq < 1:
        raise InvalidArgument([FieldViolation("at_seq", "a Watch seq: the first event's is 1")])
    for index, entry in enumerate(stored.entries):
        if entry.event_count and entry.last_event >= at_seq:
            return stored.entries[: index + 1], entry.last_event
    last = max((entry.last_event for entry in stored.entries if entry.event_count), default=0)
    raise OutOfRange([FieldViolation("at_seq", f"the source's last event is {last}; fork at a seq from 1 to {last}")])


def merged(source: Sequence[AgentSpec], replacements: Sequence[AgentSpec]) -> tuple[tuple[AgentSpec, ...], tuple[str, ...]]:
    """The fork's definitions: the source's, each replaced by the replacement of its name, then
    the new names; and the names replaced."""
    by_name = {agent.name: agent for agent in replacements}
    kept = tuple(by_name.pop(agent.name, agent) for agent in source)
    replaced = tuple(agent.name for agent in source if agent.name in {r.name for r in replacements})
    return (*kept, *by_name.values()), replaced


def build(
    fork_id: str,
    key: str,
    source_id: str,
    prefix: list[Entry],
    fork_seq: int,
    agents: tuple[AgentSpec, ...],
    replaced: tuple[str, ...],
    changes: ForkChanges,
    services: Services,
) -> tuple[Runtime, list[Entry]]:
    """The fork in memory, and its whole journal (the copy, then its own steps), to store.
    A change that cannot be made raises before anything is stored."""
    runtime = Runtime(fork_id, agents, services, key)
    runtime.journal = journal = Journal.restore(runtime.tree, services.store, runtime.events, prefix, services.clock)
    tree = runtime.tree
    held = tuple(handle.id for handle in tree.handles.values() if handle.state.in_flight or _going_on(runtime, handle))
    carved = tuple(
        (handle.id, budgets.carve(tree.agents[handle.agent.name].budget, handle.parent, bool(handle.child_key)))
        for handle in tree.handles.values()
        if handle.agent.name in replaced
    )
    own = journal.first(Forked(source_id, fork_seq, replaced, held, carved))
    for answer in changes.answers:
        own += journal.first(*_answered(runtime, answer))
    for handle_id, text in changes.messages:
        own += journal.first(_rewound(runtime, handle_id, text))
    return runtime, [*prefix, *own]


def _answered(runtime: Runtime, answer: Answer) -> list[Step]:
    """A Request pending at the cut, answered: recorded as a Resume records it, and held (the
    run goes on at the next Wake)."""
    leaf = runtime.tree.requests.get(answer.id)
    if leaf is None or leaf.pending is None:
        pending = sorted(runtime.tree.requests)
        raise FailedPrecondition(
            f"no Request pending at the cut has id {answer.id[:80]!r}; pending there: {pending[:5]}", reason="NO_SUCH_REQUEST"
        )
    services = runtime.services
    outcome = read_answer(leaf.pending, answer, services.limits, services.clock.time())
    if outcome.declined:
        steps = declined_steps(leaf, answer)
        parent = leaf.parent
        waiting = parent is not None and parent.state is HandleState.SUSPENDED and bool(leaf.child_key)
        return [*steps, *([Held(parent.id)] if waiting and parent is not None else [])]
    return [*answered_steps(leaf, answer, outcome), Held(leaf.id)]


def _rewound(runtime: Runtime, handle_id: str, text: str) -> Rewound:
    """A handle's last user message dropped (with what followed it) and `text` in its inbox."""
    handle = runtime.handle(handle_id)
    field = f"messages[{handle_id}].text"
    if not text:
        raise InvalidArgument([FieldViolation(field, "the message to put in the handle's inbox is empty")])
    check_text_size(text, field, runtime.services.limits)
    if handle.state not in (HandleState.IDLE, HandleState.HELD):
        raise FailedPrecondition(
            f"handle {handle_id!r} is {handle.state.name} at the cut; only an idle or held handle's message can be "
            "replaced (answer a pending Request with `answers`)",
            reason="HANDLE_NOT_REWINDABLE",
        )
    busy = [node.id for node in handle.subtree_leaf_first() if node is not handle and _busy(node)]
    parent = handle.parent
    if busy or (handle.child_key and parent is not None and _busy(parent)):
        raise FailedPrecondition(
            f"handle {handle_id!r} is part of a run in flight at the cut ({(busy or [handle.parent_id])[0]!r}); "
            "fork at an earlier seq, or replace the message of the handle that started it",
            reason="HANDLE_NOT_REWINDABLE",
        )
    users = [index for index, message in enumerate(handle.transcript) if message.role == "user"]
    if not users:
        raise FailedPrecondition(f"handle {handle_id!r} has no user message at the cut", reason="HANDLE_NOT_REWINDABLE")
    if len(handle.inbox) >= runtime.inbox_capacity:
        raise FailedPrecondition(f"the inbox of {handle_id!r} is full at the cut", reason="INBOX_FULL")
    item = InboxItem(text=text, channel="", sender="host")
    return Rewound(handle.id, users[-1], item, idle=handle.state is HandleState.HELD)


def _going_on(runtime: Runtime, handle: Handle) -> bool:
    """A suspended handle whose Request was answered and that nothing below it holds up: its
    run was about to go on at the cut (the step that continued it came after)."""
    if handle.state is not HandleState.SUSPENDED or handle.pending is None:
        return False
    if handle.pending.id not in runtime.tree.answered:
        return False
    return not any(_busy(node) for node in handle.subtree_leaf_first() if node is not handle)


def _busy(handle: Handle) -> bool:
    return handle.state in (HandleState.HELD, HandleState.SUSPENDED) or handle.state.in_flight


def source_of(stored: StoredRuntime | None, source_id: str) -> StoredRuntime:
    if stored is None:
        raise NotFound("runtime", source_id, "fork one of your runtimes (ListRuntimes)")
    return stored
