"""The journal in the domain alone: steps recorded through a Journal over a fake store (the
Store port as a journal uses it), replayed into a fresh Tree, and the events derived from
the entries. No gRPC, no store adapter: what the store conformance suite and the servers
build on."""

from __future__ import annotations

import pytest
from agentruntime_server.domain.errors import Fenced, NotJournaled
from agentruntime_server.domain.journal import Journal, Spawned, Tree, events_of, replay
from agentruntime_server.domain.vocabulary import Budget, HandleState
from agentruntime_server.domain.watching.event_log import EventLog

from tests.support.clock import START, FakeClock
from tests.support.fakes import JournalStore, journal, no_history
from tests.support.story import AGENTS, SPARE, figures, story


async def test_replaying_what_a_journal_appended_rebuilds_its_tree_at_every_point() -> None:
    store, clock = JournalStore(), FakeClock()
    live, _ = journal(AGENTS, store=store, clock=clock)
    groups = 0
    for group in story(live.tree):
        await live.record(*group)
        groups += 1
        rebuilt = Tree("rt", AGENTS)
        replay(rebuilt, store.entries["rt"])
        assert figures(rebuilt) == figures(live.tree), f"after group {groups}"
        await clock.advance(1.5)
    assert groups > 30 and [entry.seq for entry in store.entries["rt"]] == list(range(1, live.last_seq + 1))
    # Each step is stamped with the journal's clock as it was recorded: a group's steps at once, 1.5 s a group.
    stamps = sorted({entry.at for entry in store.entries["rt"]})
    assert stamps == [START + 1.5 * group for group in range(groups)]


async def test_the_events_derived_from_the_entries_are_those_told_live() -> None:
    store = JournalStore()
    live, told = journal(AGENTS, store=store, clock=FakeClock())
    for group in story(live.tree):
        await live.record(*group)
    derived = [event for entry in store.entries["rt"] for event in events_of(entry)]
    assert derived == told
    assert [event.seq for event in told] == list(range(1, len(told) + 1))  # no gap, none twice


async def test_a_journal_restored_from_its_entries_goes_on_where_it_stopped() -> None:
    store, clock = JournalStore(), FakeClock()
    first, _ = journal(AGENTS, store=store, clock=clock)
    groups = story(first.tree)
    for _ in range(12):
        await first.record(*next(groups))
    tree = Tree("rt", AGENTS)
    await clock.advance(60)
    events = EventLog("rt", no_history, clock=clock)
    restored = Journal.restore(tree, store, events, list(store.entries["rt"]), clock)
    assert figures(tree) == figures(first.tree)
    assert (restored.last_seq, restored.events.last_seq) == (first.last_seq, first.events.last_seq)

    await restored.record(Spawned(SPARE, "", "worker", Budget(), "", 1))
    [entry] = store.entries["rt"][first.last_seq :]
    assert (entry.seq, entry.first_event, entry.at) == (first.last_seq + 1, first.events.last_seq + 1, START + 60)
    assert tree.handles[SPARE].state == HandleState.IDLE


async def test_an_append_the_store_refuses_stops_the_journal_and_tells_nobody() -> None:
    store = JournalStore()
    live, told = journal(AGENTS, store=store, clock=FakeClock())
    groups = story(live.tree)
    await live.record(*next(groups))
    kept, heard = list(store.entries["rt"]), list(told)
    store.refusal = OSError("disk full")
    with pytest.raises(NotJournaled):
        await live.record(*next(groups))
    assert live.closed and store.entries["rt"] == kept and told == heard  # nothing told of a step not kept
    store.refusal = None
    with pytest.raises(Fenced):  # the copy ahead of its journal writes nothing more
        await live.record(*next(groups))
    assert store.entries["rt"] == kept
