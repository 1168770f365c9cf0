"""SQLite on a full disk, at the store (docs/durability.md#store-unavailable): a real tmpfs of
its own, filled to the last byte. The commit that fails is rolled back whole and refuses its
runtimes (StoreCannotWrite, reason STORE_FULL, never sqlite3's error), tells whoever holds
their copies, and reports the store unable to write; reads go on; a create meanwhile writes
nothing. Once there is room, a probe writes again by itself: nothing acknowledged was lost,
nothing refused was written, and the file is whole."""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from pathlib import Path

import pytest
from agentruntime_server.domain.errors import StoreCannotWrite
from agentruntime_server.domain.journal import Journal, Posted, Tree, replay
from agentruntime_server.domain.vocabulary import InboxItem
from agentruntime_server.domain.watching.event_log import EventLog
from agentruntime_server.store.sqlite import SqliteStore

from tests.support.disk import fill, small_disk
from tests.support.heard import listen
from tests.support.poll import until
from tests.support.replicas import no_events
from tests.support.story import AGENTS, COORDINATOR, figures, story


def big_note() -> InboxItem:
    return InboxItem(secrets.token_hex(200 * 1024), "ops", "alice")  # 400 KiB that compress to no less than half


def integrity(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as db:
        verdict: str = db.execute("PRAGMA integrity_check").fetchone()[0]
        return verdict


async def test_a_full_disk_refuses_writes_and_the_store_writes_again_once_there_is_room(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "4m") as disk:
        store = SqliteStore(str(disk / "store.db"))
        heard = listen(store)
        try:
            await store.create_runtime("a", AGENTS)
            await store.create_runtime("b", AGENTS)
            tree_a, tree_b = Tree("a", AGENTS), Tree("b", AGENTS)
            journal_a = Journal(tree_a, store, EventLog("a", no_events))
            journal_b = Journal(tree_b, store, EventLog("b", no_events))
            groups_a, groups_b = story(tree_a), story(tree_b)
            for _ in range(2):  # configured, and the coordinator spawned
                await journal_a.record(*next(groups_a))
                await journal_b.record(*next(groups_b))
            await store.flush()
            acknowledged, last = figures(tree_a), journal_a.last_seq

            ballast = fill(disk)
            await journal_a.record(Posted(COORDINATOR, big_note()))  # buffered: its commit finds no room
            with pytest.raises(StoreCannotWrite) as refused:
                await store.flush("a")
            assert refused.value.reason == "STORE_FULL"
            assert "no room left on its disk" in str(refused.value)
            assert heard.told == ["a"] and heard.health == [False]
            assert "b" not in store.unwritten  # it wrote nothing in the failed commit: its copy goes on

            # While the store cannot write, every append is refused at once (and its runtime
            # told), and so is a create, which writes nothing; reads go on.
            with pytest.raises(StoreCannotWrite):
                await journal_b.record(*next(groups_b))
            assert heard.told == ["a", "b"]
            with pytest.raises(StoreCannotWrite):
                await store.create_runtime("c", AGENTS)
            assert not await store.runtime_exists("c")
            stored = await store.load("a")
            assert stored is not None and [entry.seq for entry in stored.entries] == list(range(1, last + 1))

            ballast.unlink()
            await until(lambda: heard.health == [False, True], "the probe to write again", timeout=10)
            await store.create_runtime("c", AGENTS)

            # Read again, the runtime is what was acknowledged, and goes on with the next seqs.
            stored = await store.load("a")
            assert stored is not None and [entry.seq for entry in stored.entries] == list(range(1, last + 1))
            rebuilt = Tree("a", AGENTS)
            replay(rebuilt, stored.entries)
            assert figures(rebuilt) == acknowledged
            continued = Journal.restore(rebuilt, store, EventLog("a", no_events), stored.entries)
            await continued.record(Posted(COORDINATOR, big_note()))
            await store.flush("a")
            again = await store.load("a")
            assert again is not None and [entry.seq for entry in again.entries] == list(range(1, last + 2))
        finally:
            await store.close()
        assert integrity(disk / "store.db") == "ok"
