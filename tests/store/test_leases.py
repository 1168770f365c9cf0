"""Leases and fencing, two stores on one PostgreSQL database driven the way two processes would:
the creator owns a runtime, a claim fences every later write of the previous owner,
a lapsed replica trusts its copy only once it has renewed, renewal tells which leases were lost,
orphans are running runtimes whose owner is gone, a released lease is taken at once, and the row
of a replica gone long ago is pruned with fencing intact."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentruntime_server.domain.errors import Fenced
from agentruntime_server.domain.journal import Journal, Tree, replay
from agentruntime_server.domain.ownership import Claim
from agentruntime_server.domain.watching.event_log import EventLog
from agentruntime_server.store.postgres.leases import PRUNE_AFTER

from tests.support.replicas import LEASE, Replica, journal_of, no_events, two_replicas
from tests.support.story import AGENTS, figures, story


@pytest.fixture
async def pair(database: str) -> AsyncIterator[tuple[Replica, Replica, Any]]:
    async with two_replicas(database) as replicas:
        yield replicas


async def test_the_creator_owns_a_runtime_and_the_other_replica_is_sent_to_it(pair: tuple[Replica, Replica, Any]) -> None:
    a, b, _ = pair
    await a.store.create_runtime("rt", AGENTS)
    assert a.leases.holds("rt") and not b.leases.holds("rt")
    assert await b.leases.claim("rt") == Claim(owned=False, address="127.0.0.1:1001")
    assert await b.leases.claim("missing") == Claim(owned=False, exists=False)
    assert await b.leases.orphans() == []


async def test_a_claim_fences_every_later_write_of_the_previous_owner(pair: tuple[Replica, Replica, Any]) -> None:
    a, b, admin = pair
    await a.store.create_runtime("rt", AGENTS)
    tree, journal = journal_of(a, "rt")
    groups = story(tree)
    for _ in range(4):
        await journal.record(*next(groups))
    await a.store.flush("rt")
    acknowledged, last = figures(tree), journal.last_seq

    await a.lapse(admin)  # a is paused past its lease: b takes the runtime over
    assert await b.leases.claim("rt") == Claim(owned=True)

    await journal.record(*next(groups))  # a wakes up and writes what it was doing
    with pytest.raises(Fenced):
        await a.store.flush("rt")
    assert a.lost == ["rt"] and not a.leases.holds("rt")
    with pytest.raises(Fenced):  # and nothing it appends later is taken either
        await journal.record(*next(groups))

    stored = await b.store.load("rt")
    assert stored is not None and [entry.seq for entry in stored.entries] == list(range(1, last + 1))  # nothing of a's after
    rebuilt = Tree("rt", AGENTS)
    replay(rebuilt, stored.entries)
    assert figures(rebuilt) == acknowledged

    # b goes on from there, with the next seqs.
    continued = Journal.restore(rebuilt, b.store, EventLog("rt", no_events), stored.entries)
    await continued.record(*next(story(Tree("rt", AGENTS))))
    await b.store.flush("rt")
    again = await b.store.load("rt")
    assert again is not None and [entry.seq for entry in again.entries] == list(range(1, last + 2))


async def test_a_replica_not_renewed_for_a_lease_trusts_its_copy_only_once_it_has_renewed(
    pair: tuple[Replica, Replica, Any],
) -> None:
    a, b, admin = pair
    for runtime_id in ("kept", "taken"):
        await a.store.create_runtime(runtime_id, AGENTS)
    a.leases._renewed -= LEASE  # starved or paused for a lease: by its own clock it may have lost them
    assert not a.leases.holds("kept") and not a.leases.holds("taken")
    await a.lapse(admin)
    assert await b.leases.claim("taken") == Claim(owned=True)
    await a.leases.confirm()  # what a copy's next reader does first: renew, and learn what was lost
    assert a.leases.holds("kept") and not a.leases.holds("taken")
    assert a.lost == ["taken"]


async def test_renewal_tells_a_replica_which_leases_it_lost(pair: tuple[Replica, Replica, Any]) -> None:
    a, b, admin = pair
    for runtime_id in ("kept", "taken"):
        await a.store.create_runtime(runtime_id, AGENTS)
    await a.lapse(admin)
    assert await b.leases.claim("taken") == Claim(owned=True)
    assert await a.leases.renew() == ["taken"]  # and a is live again: "kept" stays a's
    assert a.leases.holds("kept") and not a.leases.holds("taken")
    assert await b.leases.claim("kept") == Claim(owned=False, address="127.0.0.1:1001")


async def test_a_runtime_created_during_a_renewal_stays_its_creators(pair: tuple[Replica, Replica, Any]) -> None:
    """A renewal that reads a new runtime's row before its creator has recorded the epoch must
    not give it up: the creator answers from its copy, so nobody else may claim it (found
    under load: a Spawn at another replica claimed it, and the creator's Wake said NOT_FOUND)."""
    a, b, _ = pair
    created: list[str] = []

    async def create_many() -> None:
        for n in range(150):
            await a.store.create_runtime(f"new-{n}", AGENTS)
            created.append(f"new-{n}")

    async def renew_meanwhile() -> None:
        while len(created) < 150:
            await a.leases.renew()

    await asyncio.gather(create_many(), renew_meanwhile())
    assert all(a.leases.holds(runtime_id) for runtime_id in created)
    taken = [runtime_id for runtime_id in created if (await b.leases.claim(runtime_id)).owned]
    assert taken == []


async def test_orphans_are_running_runtimes_whose_owner_is_gone(pair: tuple[Replica, Replica, Any]) -> None:
    a, b, admin = pair
    await a.store.create_runtime("busy", AGENTS)
    await a.store.create_runtime("idle", AGENTS)
    tree, journal = journal_of(a, "busy")
    groups = story(tree)
    while not tree.active:  # until a handle runs: the runtime is marked running
        await journal.record(*next(groups))
    await a.store.flush()
    assert await b.leases.orphans() == []  # a is live
    await a.lapse(admin)
    assert await b.leases.orphans() == ["busy"]  # the idle one needs nobody
    await a.leases.renew()
    assert await b.leases.orphans() == []


async def test_retention_keeps_a_runtime_another_replica_took_after_the_listing(pair: tuple[Replica, Replica, Any]) -> None:
    a, b, admin = pair
    for runtime_id in ("taken", "left"):
        await a.store.create_runtime(runtime_id, AGENTS)
        await a.leases.release(runtime_id)  # in no replica's memory: either may delete it once idle
    await asyncio.sleep(0.01)
    before = time.time()
    assert sorted(await b.store.idle_runtimes(before)) == ["left", "taken"]
    assert await a.leases.claim("taken") == Claim(owned=True)  # a loads it after b's listing
    assert await b.store.delete_if_idle("taken", before) is False  # not under a live replica's copy
    assert await b.store.delete_if_idle("left", before) is True
    await a.lapse(admin)
    assert await b.store.delete_if_idle("taken", before) is True  # a is gone: its copy with it


async def test_a_released_lease_is_taken_at_once_and_a_graceful_stop_releases_all(
    pair: tuple[Replica, Replica, Any],
) -> None:
    a, b, _ = pair
    for runtime_id in ("one", "two", "three"):
        await a.store.create_runtime(runtime_id, AGENTS)
    await a.leases.release("one")
    assert await b.leases.claim("one") == Claim(owned=True)
    await a.leases.release_all()
    assert await b.leases.claim("two") == Claim(owned=True)
    assert await b.leases.claim("three") == Claim(owned=True)
    assert not any(a.leases.holds(runtime_id) for runtime_id in ("one", "two", "three"))


async def expire(admin: Any, replica: Replica, ago: float) -> None:
    """As if the replica's last renewal had been `ago` seconds before its lease ran out."""
    await admin.execute(
        "UPDATE replicas SET expires_at = extract(epoch FROM clock_timestamp()) - $2 WHERE id = $1",
        replica.leases.replica_id,
        ago,
    )


async def test_a_replica_gone_long_ago_loses_its_row_and_fencing_holds(pair: tuple[Replica, Replica, Any], database: str) -> None:
    """A renewal deletes the rows of replicas expired over PRUNE_AFTER ago, never a live one's
    nor one lapsed lately. A runtime whose owner's row is gone is taken over like any dead
    replica's, and its old owner's writes are fenced; a replica paused that long comes back with
    its row and keeps what nobody claimed meanwhile."""
    a, b, admin = pair
    killed, paused, lately = (Replica(database, f"127.0.0.1:{port}") for port in (1003, 1004, 1005))
    try:
        for replica in (killed, paused, lately):
            await replica.leases.start()
        await paused.store.create_runtime("kept", AGENTS)
        await killed.store.create_runtime("busy", AGENTS)
        tree, journal = journal_of(killed, "busy")
        groups = story(tree)
        while not tree.active:  # a handle runs: the runtime is an orphan once its owner is dead
            await journal.record(*next(groups))
        await killed.store.flush()
        for replica in (killed, paused):
            await expire(admin, replica, PRUNE_AFTER + 60)
        paused.leases._renewed -= PRUNE_AFTER + 60  # by its own clock too: it has not run since
        await expire(admin, lately, LEASE)

        await b.leases.renew()
        rows = {row[0] for row in await admin.fetch("SELECT id FROM replicas")}
        assert rows == {r.leases.replica_id for r in (a, b, lately)}

        assert await b.leases.orphans() == ["busy"]
        assert await b.leases.claim("busy") == Claim(owned=True)
        await journal.record(*next(groups))  # the killed replica's last write lands late
        with pytest.raises(Fenced):
            await killed.store.flush("busy")

        assert not paused.leases.holds("kept")  # it wakes up: nothing answers before it renews
        assert await paused.leases.renew() == []
        assert paused.leases.holds("kept")
        assert await b.leases.claim("kept") == Claim(owned=False, address="127.0.0.1:1004")
        rows = {row[0] for row in await admin.fetch("SELECT id FROM replicas")}
        assert rows == {r.leases.replica_id for r in (a, b, lately, paused)}
    finally:
        for replica in (killed, paused, lately):
            await replica.store.close()
