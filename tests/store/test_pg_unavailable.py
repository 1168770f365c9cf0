"""PostgreSQL going away, at the store (docs/durability.md#store-unavailable): its connections
are cut by the database itself (pg_terminate_backend, as a restart or a failover would). The
commit that fails refuses its runtimes (StoreUnavailable, never asyncpg's error), forgets
what of theirs was still buffered, tells whoever holds their copies, and reports the store
away then back; nothing acknowledged is lost and nothing refused is ever written."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from agentruntime_server.domain.errors import StoreUnavailable
from agentruntime_server.domain.journal import Journal, Tree, replay
from agentruntime_server.domain.watching.event_log import EventLog
from agentruntime_server.store.postgres import PostgresStore

from tests.support.heard import listen
from tests.support.poll import until
from tests.support.postgres import cut_connections
from tests.support.replicas import no_events
from tests.support.story import AGENTS, figures, story


@pytest.fixture
async def store(database: str) -> AsyncIterator[PostgresStore]:
    made = PostgresStore(database)
    yield made
    await made.close()


async def test_a_failed_commit_refuses_its_runtimes_and_the_store_comes_back_by_itself(
    store: PostgresStore, database: str
) -> None:
    heard = listen(store)
    await store.create_runtime("a", AGENTS)
    await store.create_runtime("b", AGENTS)
    tree_a, tree_b = Tree("a", AGENTS), Tree("b", AGENTS)
    journal_a = Journal(tree_a, store, EventLog("a", no_events))
    journal_b = Journal(tree_b, store, EventLog("b", no_events))
    groups_a, groups_b = story(tree_a), story(tree_b)
    await journal_a.record(*next(groups_a))
    await journal_b.record(*next(groups_b))
    await store.flush("a")
    acknowledged, last = figures(tree_a), journal_a.last_seq

    await cut_connections(database)
    await journal_a.record(*next(groups_a))  # buffered: its commit meets a dead connection
    with pytest.raises(StoreUnavailable) as refused:
        await store.flush("a")
    assert refused.value.reason == "STORE_UNAVAILABLE"
    assert heard.told == ["a"] and heard.health[:1] == [False]
    assert "b" not in store.unwritten  # it wrote nothing in the failed commit: its copy goes on

    # While the store is away, every append is refused at once (and its runtime told), and so is every read.
    with pytest.raises(StoreUnavailable):
        await journal_b.record(*next(groups_b))
    assert heard.told == ["a", "b"]
    assert not store.available  # the first probe is PROBE_EVERY away
    with pytest.raises(StoreUnavailable):
        await store.load("a")

    await until(lambda: store.available, "the probe to reach the database again", timeout=10)
    assert heard.health == [False, True]
    await store.flush()  # a later flush awaits no failure of the past

    # Read again, the runtime is what was acknowledged, and goes on with the next seqs.
    stored = await store.load("a")
    assert stored is not None and [entry.seq for entry in stored.entries] == list(range(1, last + 1))
    rebuilt = Tree("a", AGENTS)
    replay(rebuilt, stored.entries)
    assert figures(rebuilt) == acknowledged
    continued = Journal.restore(rebuilt, store, EventLog("a", no_events), stored.entries)
    await continued.record(*next(story(Tree("a", AGENTS))))
    await store.flush("a")
    again = await store.load("a")
    assert again is not None and [entry.seq for entry in again.entries] == list(range(1, last + 2))
