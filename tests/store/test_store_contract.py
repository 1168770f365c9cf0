"""The store conformance suite (issue 10): the contract of domain/ports/store.py `Store`, held to
every backend the same way, without gRPC.

Each test takes a `backend` (a way to open a store on one place: `backend.open()`), made by
one of FACTORIES; a new backend is one line there. The journal the tests store is real: a
`Journal` over a `Tree`, recording the steps the runtime records (see `story`), so that
what is appended is exactly what a server appends, events and all."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import sqlite3
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.domain.errors import AlreadyExists, RequestIdTaken
from agentruntime_server.domain.journal import (
    STEPS,
    Closed,
    Configured,
    Entry,
    EventsImported,
    Imported,
    Journal,
    Posted,
    Settled,
    Spawned,
    Step,
    Tree,
    events_of,
    replay,
)
from agentruntime_server.domain.journal.tree import RuntimeCounts
from agentruntime_server.domain.ports import Store, TenantReply
from agentruntime_server.domain.tenancy.quotas import QuotaExceeded
from agentruntime_server.domain.vocabulary import (
    AgentSpec,
    Budget,
    HandleState,
    HttpExecutor,
    InboxItem,
    PendingRequest,
    RelayExecutor,
    RuntimeOptions,
    TaskResult,
)
from agentruntime_server.domain.watching.event_log import Event, EventLog
from agentruntime_server.store.memory import MemoryStore
from agentruntime_server.store.payloads import definitions_json, encode
from agentruntime_server.store.postgres import PostgresStore
from agentruntime_server.store.postgres.migrations import MIGRATIONS as PG_MIGRATIONS
from agentruntime_server.store.sqlite import SqliteStore
from agentruntime_server.store.sqlite.migrations import MIGRATIONS

from tests.support.build import agent, create, run
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.postgres import POSTGRES
from tests.support.servers import serve
from tests.support.story import AGENTS, COORDINATOR, SPARE, WORKER, figures, story

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store-v0.1.0.db"


# name -> (a test's tmp_path -> a function opening a store on the same place each call).
# One line per backend; a backend whose name is in NEEDS gets its session fixture first.
FACTORIES: dict[str, Callable[[Path], Callable[[], Store]]] = {
    "memory": lambda tmp: MemoryStore,
    "sqlite": lambda tmp: lambda: SqliteStore(str(tmp / "s.db")),
    "postgres": lambda tmp: lambda: PostgresStore(POSTGRES["url"], schema=tmp.name),  # a schema a test
}
NEEDS = {"postgres": "postgres"}


@dataclass
class Backend:
    name: str
    opener: Callable[[], Store]
    opened: list[Store] = field(default_factory=list)

    def open(self) -> Store:
        """A store on this backend's place (the same data each time, for a durable one)."""
        store = self.opener()
        self.opened.append(store)
        return store


@pytest.fixture(params=list(FACTORIES))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param in NEEDS:
        request.getfixturevalue(NEEDS[request.param])
    made = Backend(request.param, FACTORIES[request.param](tmp_path))
    yield made
    for store in made.opened:
        await store.close()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.open()


def durable_only(store: Store) -> None:
    if not store.durable:
        pytest.skip(f"{type(store).__name__} is not durable (durable = False): nothing survives it to check")


# ---- a real journal -----------------------------------------------------------------------


RECORDED_KINDS = set(STEPS) - {Imported, EventsImported}  # those two only come from a migration


class Tee:
    """The store under test, keeping a copy of every entry the journal appends to it: what
    load and entries_after_event must give back."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.appended: dict[str, list[Entry]] = defaultdict(list)

    @property
    def durable(self) -> bool:
        return self.store.durable

    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: RuntimeCounts | None = None,
    ) -> None:
        await self.store.append(runtime_id, entries, running, counts)
        self.appended[runtime_id].extend(entries)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def _no_history(after: int, limit: int) -> list[Event]:
    return []


def rebuilt(runtime_id: str, agents: tuple[AgentSpec, ...], entries: Sequence[Entry]) -> Tree:
    tree = Tree(runtime_id, agents)
    replay(tree, entries)
    return tree


class Lived:
    """A runtime driven live through a real Journal over a Tree, one group of its story at a
    time (so that tests can interleave runtimes), keeping the tree's figures after each group
    by the journal's last seq then."""

    def __init__(self, store: Store | Tee, runtime_id: str, agents: tuple[AgentSpec, ...] = AGENTS) -> None:
        self.tree = Tree(runtime_id, agents)
        self.journal = Journal(self.tree, store, EventLog(runtime_id, _no_history))
        self.groups = story(self.tree)
        self.figures: dict[int, dict[str, Any]] = {}

    async def step(self) -> bool:
        group = next(self.groups, None)
        if group is None:
            return False
        await self.journal.record(*group)
        self.figures[self.journal.last_seq] = figures(self.tree)
        return True

    async def run(self) -> Lived:
        while await self.step():
            pass
        return self


async def created(store: Store | Tee, runtime_id: str) -> Lived:
    await store.create_runtime(runtime_id, AGENTS)
    return Lived(store, runtime_id)


def entry(seq: int, step: Step, first_event: int = 1, event_count: int = 0, at: float = 1_700_000_000.125) -> Entry:
    return Entry(seq, at, first_event, event_count, step)


# ---- runtimes ----------------------------------------------------------------------------


async def test_an_unknown_runtime_does_not_exist_and_loads_as_none(store: Store) -> None:
    assert await store.runtime_exists("nobody") is False
    assert await store.load("nobody") is None


async def test_a_created_runtime_exists_and_its_agents_round_trip(store: Store) -> None:
    await store.create_runtime("rt-1", AGENTS)
    assert await store.runtime_exists("rt-1") is True
    assert await store.runtime_exists("rt-2") is False
    loaded = await store.load("rt-1")
    assert loaded is not None
    assert loaded.agents == AGENTS
    assert [type(tool.executor) for agent in loaded.agents for tool in agent.tools] == [HttpExecutor, RelayExecutor, HttpExecutor]
    assert loaded.entries == []


async def test_a_runtime_is_created_with_its_first_entries_all_or_nothing(backend: Backend) -> None:
    """CreateRuntime's options are journaled with the runtime, in one transaction: a crash
    can never leave a runtime without them (and its id taken for a retry)."""
    store = backend.open()
    configured = entry(1, Configured(RuntimeOptions(inbox_capacity=10)))
    await store.create_runtime("rt-1", AGENTS, "acme", [configured])
    loaded = await store.load("rt-1")
    assert loaded is not None and loaded.entries == [configured]
    await store.append("rt-1", [entry(2, Spawned(SPARE, "", "worker", Budget(), "", 1))])  # after them
    with pytest.raises(ValueError):  # entries out of order: no runtime either
        await store.create_runtime("rt-2", AGENTS, "acme", [entry(2, Configured(RuntimeOptions()))])
    assert await store.runtime_exists("rt-2") is False
    with pytest.raises(AlreadyExists):
        await store.create_runtime("rt-1", AGENTS, "acme", [entry(1, Configured(RuntimeOptions(inbox_capacity=5)))])
    await store.flush()
    if store.durable:
        store = backend.open()
    loaded = await store.load("rt-1")
    assert loaded is not None and [e.seq for e in loaded.entries] == [1, 2] and loaded.entries[0] == configured


async def test_a_tenant_gets_no_runtime_past_its_quota(store: Store) -> None:
    for runtime_id in ("a-1", "a-2"):
        await store.create_runtime(runtime_id, AGENTS, "acme", quota=2)
    with pytest.raises(QuotaExceeded) as refused:
        await store.create_runtime("a-3", AGENTS, "acme", [entry(1, Configured(RuntimeOptions()))], quota=2)
    assert refused.value.quota == "runtimes" and refused.value.subject == "tenant:acme"
    assert await store.runtime_exists("a-3") is False and await store.count_runtimes("acme") == 2
    await store.create_runtime("b-1", AGENTS, "bolt", quota=1)  # the quota is the tenant's own
    await store.create_runtime("a-3", AGENTS, "acme")  # 0: no quota
    await store.delete_runtime("a-1")
    await store.create_runtime("a-4", AGENTS, "acme", quota=3)
    assert await store.count_runtimes("acme") == 3


async def test_stores_on_one_place_creating_at_once_keep_the_quota(backend: Backend) -> None:
    """Replicas on one database: the count and the insert are one step for all of them."""
    first = backend.open()
    if not first.durable:
        pytest.skip(f"{type(first).__name__} is not shared: a second one is another place")
    second = backend.open()
    creates = [
        store.create_runtime(f"rt-{n}-{m}", AGENTS, "acme", [entry(1, Configured(RuntimeOptions()))], quota=5)
        for n, store in enumerate((first, second))
        for m in range(15)
    ]
    outcomes = await asyncio.gather(*creates, return_exceptions=True)
    assert all(outcome is None or isinstance(outcome, QuotaExceeded) for outcome in outcomes), outcomes
    assert sum(outcome is None for outcome in outcomes) == 5
    assert await first.count_runtimes("acme") == await second.count_runtimes("acme") == 5


async def test_stores_on_one_place_creating_one_id_at_once_create_it_once_and_spare_the_rest(backend: Backend) -> None:
    """Two stores on one database create the same runtime, and the same request id's runtime,
    at once (SQLite writes creations with the group commit of the tick): one of each is
    created, the other refused whole (no row, no answer, no step), and what was written in the
    same commits is written."""
    first = backend.open()
    if not first.durable:
        pytest.skip(f"{type(first).__name__} is not shared: a second one is another place")
    second = backend.open()
    made = TenantReply("acme", "", "id-1", "CreateRuntime", "d1", "", time.time())
    configured = [entry(1, Configured(RuntimeOptions(inbox_capacity=3)))]
    outcomes = await asyncio.gather(
        first.create_runtime("acme:twice", AGENTS, "acme", configured),
        first.create_runtime("acme:first-only", AGENTS, "acme", configured),
        first.create_runtime("acme:asked-1", AGENTS, "acme", configured, reply=dataclasses.replace(made, runtime_id="asked-1")),
        second.create_runtime("acme:twice", AGENTS, "acme", configured),
        second.create_runtime("acme:second-only", AGENTS, "acme", configured),
        second.create_runtime("acme:asked-2", AGENTS, "acme", configured, reply=dataclasses.replace(made, runtime_id="asked-2")),
        return_exceptions=True,
    )
    twice = [outcomes[0], outcomes[3]]
    assert sorted(type(o).__name__ for o in twice) == ["NoneType", "RuntimeExists"], outcomes
    asked = [outcomes[2], outcomes[5]]
    assert sorted(type(o).__name__ for o in asked) == ["NoneType", "RequestIdTaken"], outcomes
    assert outcomes[1] is None and outcomes[4] is None
    winner = "asked-1" if asked[0] is None else "asked-2"
    loser = "asked-2" if winner == "asked-1" else "asked-1"
    for store in (first, second):
        await store.flush()
    reader = backend.open()
    for runtime_id in ("acme:twice", "acme:first-only", "acme:second-only", f"acme:{winner}"):
        loaded = await reader.load(runtime_id)
        assert loaded is not None and [e.seq for e in loaded.entries] == [1], runtime_id
    assert await reader.runtime_exists(f"acme:{loser}") is False and await reader.load(f"acme:{loser}") is None
    kept = await reader.reply("acme", "", "id-1")
    assert kept is not None and kept.runtime_id == winner
    assert await reader.count_runtimes("acme") == 4


async def test_a_tenants_bytes_are_its_runtimes_definitions_and_steps(backend: Backend) -> None:
    """What the store-bytes quota reads: per tenant, each runtime's definitions (their JSON) and
    its steps (their payloads, and the few bytes a backend frames each in: SQLite's group
    rows), kept as they are appended and deleted with the runtime."""
    store = backend.open()
    assert await store.tenant_bytes("default") == 0
    tee = Tee(store)
    await (await created(tee, "rt-1")).run()  # every step kind, over many commits
    first = [entry(1, Configured(RuntimeOptions(inbox_capacity=10)))]
    later = [entry(2, Spawned(SPARE, "", "worker", Budget(), "", 1)), entry(3, Posted(SPARE, InboxItem("x" * 5000, "ops", "al")))]
    await store.create_runtime("acme:rt-1", AGENTS, "acme", first)
    await store.append("acme:rt-1", later)
    await store.flush()
    definitions = len(definitions_json(AGENTS))

    def taken(entries: Sequence[Entry]) -> tuple[int, int]:
        """At least the definitions and the steps; at most 64 bytes more a step."""
        steps = definitions + sum(len(encode(e.step)) for e in entries)
        return steps, steps + 64 * len(entries)

    ours, theirs = await store.tenant_bytes("default"), await store.tenant_bytes("acme")
    assert taken(tee.appended["rt-1"])[0] <= ours <= taken(tee.appended["rt-1"])[1]
    assert taken(first + later)[0] <= theirs <= taken(first + later)[1]
    assert await store.tenant_bytes("nobody") == 0
    if store.durable:
        assert await backend.open().tenant_bytes("acme") == theirs  # kept, not counted in memory
    await store.create_runtime("acme:rt-2", AGENTS, "acme")
    await store.delete_runtime("acme:rt-1")
    assert (await store.tenant_bytes("default"), await store.tenant_bytes("acme")) == (ours, definitions)


# ---- the journal -------------------------------------------------------------------------


async def test_every_entry_loads_back_in_order_field_by_field(store: Store) -> None:
    tee = Tee(store)
    lived = await (await created(tee, "rt-1")).run()
    appended = tee.appended["rt-1"]
    assert {type(e.step) for e in appended} == RECORDED_KINDS, "the story must record every step kind a runtime records"
    loaded = await store.load("rt-1")  # the same store, before any flush: it reads its own writes
    assert loaded is not None
    assert [e.seq for e in loaded.entries] == list(range(1, len(appended) + 1)) == [e.seq for e in appended]
    for got, sent in zip(loaded.entries, appended, strict=True):
        assert type(got.step) is type(sent.step)
        assert (got.seq, got.at, got.first_event, got.event_count, got.last_event) == (
            sent.seq,
            sent.at,
            sent.first_event,
            sent.event_count,
            sent.last_event,
        )
        assert got.step == sent.step, f"entry {sent.seq} ({type(sent.step).__name__})"
        assert got == sent
    assert lived.journal.last_seq == len(appended)


async def test_a_journal_read_up_to_an_event_is_the_loaded_one_up_to_the_entry_that_made_it(store: Store) -> None:
    """What a fork reads of its source (domain/runtime/forks.py): every entry up to the one
    that made the event, whatever the backend groups in a row, and a read that changes nothing."""
    await (await created(store, "rt-1")).run()
    whole = await store.load("rt-1")
    assert whole is not None
    last = max(entry.last_event for entry in whole.entries)
    for upto in range(0, last + 2):
        read = await store.load_until("rt-1", upto)
        assert read is not None and read.agents == whole.agents
        assert read.entries == [entry for entry in whole.entries if entry.first_event <= upto], upto
    assert await store.load_until("rt-none", 5) is None
    assert await store.load("rt-1") == whole


async def test_replaying_the_loaded_journal_rebuilds_the_live_tree_at_every_point(store: Store) -> None:
    lived = await (await created(store, "rt-1")).run()
    loaded = await store.load("rt-1")
    assert loaded is not None
    assert figures(rebuilt("rt-1", loaded.agents, loaded.entries)) == figures(lived.tree)
    # Not only at the end: after every group the journal recorded, the prefix replays to it.
    tree = Tree("rt-1", loaded.agents)
    done = 0
    for last_seq, expected in lived.figures.items():
        replay(tree, loaded.entries[done:last_seq])
        done = last_seq
        assert figures(tree) == expected, f"after seq {last_seq}"
    # And the figures the story was written to produce.
    coordinator, worker = tree.handles[COORDINATOR], tree.handles[WORKER]
    assert (coordinator.usage.own_tokens, coordinator.usage.total_tokens, coordinator.usage.turns) == (200, 220, 2)
    assert (worker.usage.own_tokens, worker.usage.tool_calls, worker.state) == (20, 2, HandleState.CLOSED)
    assert coordinator.state is HandleState.IDLE and coordinator.in_doubt == {"call_2_1"}
    assert [item.text for item in coordinator.inbox] == ["first note", "second note", "a note at the fork"]
    assert list(tree.answered) == [f"{WORKER}/call_1_1:tool_call"] and tree.requests == {}


async def test_a_suspended_tree_replays_with_its_live_request(store: Store) -> None:
    lived = await created(store, "rt-1")
    while not lived.tree.requests:
        assert await lived.step()
    loaded = await store.load("rt-1")
    assert loaded is not None
    tree = rebuilt("rt-1", loaded.agents, loaded.entries)
    assert figures(tree) == figures(lived.tree)
    assert {request_id: handle.id for request_id, handle in tree.requests.items()} == {f"{WORKER}/call_1_1:tool_call": WORKER}
    assert [tree.handles[h].state for h in (COORDINATOR, WORKER)] == [HandleState.SUSPENDED, HandleState.SUSPENDED]


async def test_interleaved_runtimes_keep_their_own_order_and_never_mix(store: Store) -> None:
    tee = Tee(store)
    runtimes = [await created(tee, f"rt-{n}") for n in range(3)]
    # Round robin, one group each, sometimes within one event-loop tick, sometimes across.
    going = list(runtimes)
    turn = 0
    while going:
        for lived in list(going):
            if not await lived.step():
                going.remove(lived)
        turn += 1
        if turn % 3 == 0:
            await asyncio.sleep(0)
    for lived in runtimes:
        runtime_id = lived.tree.runtime_id
        loaded = await store.load(runtime_id)
        assert loaded is not None
        assert loaded.entries == tee.appended[runtime_id]
        assert [e.seq for e in loaded.entries] == list(range(1, len(loaded.entries) + 1))
        assert figures(rebuilt(runtime_id, loaded.agents, loaded.entries)) == figures(lived.tree)
    # The same story three times: equal steps, in three runtimes, each whole.
    steps = [[e.step for e in tee.appended[lived.tree.runtime_id]] for lived in runtimes]
    assert steps[0] == steps[1] == steps[2]


async def test_a_runtime_forgotten_at_any_point_goes_on_with_its_own_seqs(store: Store) -> None:
    # forget() comes as a runtime leaves the cache: with its last entries buffered or written,
    # and before it is loaded again (every third step here) or not.
    tee = Tee(store)
    forgotten, kept = await created(tee, "rt-forgotten"), await created(tee, "rt-kept")
    steps = 0
    while await forgotten.step():
        await kept.step()
        store.forget("rt-forgotten")
        steps += 1
        if steps % 2 == 0:
            await asyncio.sleep(0)  # a commit may land between two steps, or not
        if steps % 3 == 0:
            assert await store.load("rt-forgotten") is not None
    await kept.run()
    assert steps > 3
    for lived in (forgotten, kept):
        runtime_id = lived.tree.runtime_id
        loaded = await store.load(runtime_id)
        assert loaded is not None and loaded.entries == tee.appended[runtime_id]
        assert [e.seq for e in loaded.entries] == list(range(1, len(loaded.entries) + 1))


async def test_entries_after_event_are_those_with_a_later_event_in_order(store: Store) -> None:
    tee = Tee(store)
    await (await created(tee, "rt-1")).run()
    await (await created(tee, "rt-2")).run()  # another runtime's events never show
    appended = tee.appended["rt-1"]
    last = max(e.last_event for e in appended)
    assert last > 20
    for after in [0, 1, 2, 5, last // 2, last - 1, last, last + 1, last + 100]:
        got = await store.entries_after_event("rt-1", after)
        assert got == [e for e in appended if e.last_event > after], f"after {after}"
    assert await store.entries_after_event("rt-1", last) == []
    events = [event for e in await store.entries_after_event("rt-1", 0) for event in events_of(e)]
    assert [event.seq for event in events] == list(range(1, last + 1))
    assert all(event.handle_id in (COORDINATOR, WORKER, SPARE) for event in events)


async def test_entries_after_event_come_in_pages_of_at_most_the_limit(store: Store) -> None:
    """A watcher pages its history: each page is the first `limit` of what an unlimited read
    gives, and paging on after the last event of each page gives every event once, in order
    (SQLite's group rows are cut inside, at any entry)."""
    tee = Tee(store)
    await (await created(tee, "rt-1")).run()
    await (await created(tee, "rt-2")).run()
    appended = tee.appended["rt-1"]
    last = max(e.last_event for e in appended)
    for limit in (1, 2, 3, 7, 1000):
        for after in [0, 1, 2, last // 2, last - 1, last]:
            page = await store.entries_after_event("rt-1", after, limit)
            assert page == [e for e in appended if e.last_event > after][:limit], f"after {after}, limit {limit}"
        seen, events, pages = 0, [], 0
        while page := await store.entries_after_event("rt-1", seen, limit):
            assert len(page) <= limit
            events += [event for e in page for event in events_of(e) if event.seq > seen]
            seen = page[-1].last_event
            pages += 1
        assert [event.seq for event in events] == list(range(1, last + 1)), f"limit {limit}"
        if limit == 1:  # a page for each entry with events: the entries without any after a page are passed over
            assert pages == len([e for e in appended if e.event_count])


async def test_an_entry_without_events_sits_between_its_neighbours(store: Store) -> None:
    await store.create_runtime("rt-1", AGENTS)
    spawned = Spawned(SPARE, "", "worker", Budget(), "", 1)
    entries = [
        entry(1, spawned, first_event=1, event_count=1),  # last event 1
        entry(2, Posted(SPARE, InboxItem("a", "c", "s")), first_event=2, event_count=0),  # none: last_event 1
        entry(3, Closed(SPARE), first_event=2, event_count=1),  # last event 2
    ]
    await store.append("rt-1", entries)
    assert await store.entries_after_event("rt-1", 0) == entries
    assert await store.entries_after_event("rt-1", 1) == entries[2:]
    assert await store.entries_after_event("rt-1", 2) == []


async def test_running_runtimes_follow_the_running_flag_of_append(store: Store) -> None:
    for runtime_id in ("rt-a", "rt-b", "rt-c"):
        await store.create_runtime(runtime_id, AGENTS)
    spawned = Spawned(SPARE, "", "worker", Budget(), "", 1)
    assert await store.runtimes_with_running_handles() == []
    await store.append("rt-b", [entry(1, spawned)], True)
    assert await store.runtimes_with_running_handles() == ["rt-b"]
    await store.append("rt-a", [entry(1, spawned)], True)
    await store.append("rt-c", [entry(1, spawned)])  # None: unchanged (not running)
    assert await store.runtimes_with_running_handles() == ["rt-a", "rt-b"]
    await store.append("rt-b", [entry(2, Closed(SPARE))], None)  # None: unchanged (running)
    assert await store.runtimes_with_running_handles() == ["rt-a", "rt-b"]
    await store.append("rt-b", [entry(3, Posted(SPARE, InboxItem("a", "c", "s")))], False)
    assert await store.runtimes_with_running_handles() == ["rt-a"]
    await store.append("rt-a", [entry(2, Closed(SPARE))], False)
    assert await store.runtimes_with_running_handles() == []


async def test_the_journal_marks_a_runtime_running_while_a_handle_runs(store: Store) -> None:
    lived = await created(store, "rt-1")
    seen = []
    while await lived.step():
        seen.append((lived.tree.running > 0, await store.runtimes_with_running_handles() == ["rt-1"]))
    assert all(tree == stored for tree, stored in seen), seen
    assert (True, True) in seen and seen[-1] == (False, False)


# ---- retention ---------------------------------------------------------------------------


async def idle_from(store: Store, *runtime_ids: str) -> float:
    """Each runtime created with one entry, all of it flushed; then the time from which the
    listing of retention takes them as idle."""
    for runtime_id in runtime_ids:
        await store.create_runtime(runtime_id, AGENTS)
        await store.append(runtime_id, [entry(1, Spawned(SPARE, "", "worker", Budget(), "", 1))])
    await store.flush()
    await asyncio.sleep(0.01)
    before = time.time()
    assert sorted(await store.idle_runtimes(before)) == sorted(runtime_ids)
    return before


async def test_an_idle_runtime_is_deleted_with_its_journal_and_could_be_created_anew(store: Store) -> None:
    before = await idle_from(store, "rt-1", "rt-2")
    assert await store.delete_if_idle("rt-1", before) is True
    assert await store.runtime_exists("rt-1") is False and await store.load("rt-1") is None
    assert await store.idle_runtimes(before) == ["rt-2"]
    assert await store.delete_if_idle("rt-1", before) is False  # gone already
    await store.create_runtime("rt-1", AGENTS)
    await store.append("rt-1", [entry(1, Spawned(SPARE, "", "worker", Budget(), "", 1))])  # seq 1 again
    loaded = await store.load("rt-1")
    assert loaded is not None and [e.seq for e in loaded.entries] == [1]


async def test_a_runtime_written_after_the_listing_is_not_deleted(store: Store) -> None:
    """Retention lists, then deletes one runtime at a time: whatever a runtime was written in
    between (an acknowledged Spawn), its delete is refused, and the write kept."""
    before = await idle_from(store, "flushed", "buffered", "running", "untouched")
    await store.append("flushed", [entry(2, Closed(SPARE))])
    await store.flush()
    await store.append("running", [entry(2, Posted(SPARE, InboxItem("a", "c", "s")))], True)
    await store.flush()
    await store.append("buffered", [entry(2, Closed(SPARE))])  # not flushed: the group commit's still
    for runtime_id in ("buffered", "flushed", "running"):
        assert await store.delete_if_idle(runtime_id, before) is False, runtime_id
        loaded = await store.load(runtime_id)
        assert loaded is not None and [e.seq for e in loaded.entries] == [1, 2], runtime_id
    assert await store.delete_if_idle("untouched", before) is True
    assert await store.idle_runtimes(before) == []
    assert await store.delete_if_idle("running", time.time() + 1) is False  # a handle runs: never idle


async def test_a_suspended_runtime_is_idle_only_by_its_own_cutoff(store: Store) -> None:
    """Retention's two cutoffs: one for runtimes with nothing running or suspended, one for
    those a Request keeps waiting on a host (a handle SUSPENDED, by the counts of append). A
    cutoff of None keeps its kind for ever; a runtime with a run in flight (or an expiring
    Request: the running flag) is never idle."""
    spawned = entry(1, Spawned(SPARE, "", "worker", Budget(), "", 1))
    shapes = {
        "settled": (False, RuntimeCounts(1, 0, 0)),
        "suspended": (False, RuntimeCounts(2, 0, 2)),
        "running": (True, RuntimeCounts(1, 1, 0)),
        "suspended-expiring": (True, RuntimeCounts(1, 0, 1)),
    }
    for runtime_id, (running, counts) in shapes.items():
        await store.create_runtime(runtime_id, AGENTS)
        await store.append(runtime_id, [spawned], running, counts)
    await store.flush()
    await asyncio.sleep(0.01)
    before = time.time()
    earlier = before - 3600  # before any of them was written

    assert await store.idle_runtimes(before) == ["settled"]  # suspended ones kept for ever
    assert await store.idle_runtimes(None, before) == ["suspended"]
    assert sorted(await store.idle_runtimes(before, before)) == ["settled", "suspended"]
    assert await store.idle_runtimes(earlier, before) == ["suspended"]
    assert await store.idle_runtimes(before, earlier) == ["settled"]
    assert await store.idle_runtimes(None, None) == []

    assert await store.delete_if_idle("suspended", before) is False
    assert await store.delete_if_idle("suspended", before, earlier) is False
    assert await store.delete_if_idle("settled", None, before) is False
    for runtime_id in ("running", "suspended-expiring"):
        assert await store.delete_if_idle(runtime_id, before, before) is False, runtime_id
    assert await store.delete_if_idle("suspended", None, before) is True
    assert await store.delete_if_idle("settled", before, None) is True
    assert sorted(await store.idle_runtimes(before, before)) == []
    assert await store.runtime_exists("suspended") is False and await store.runtime_exists("running") is True

    # Answered and settled (its counts say nothing is suspended now): the settled cutoff is its own.
    await store.append("suspended-expiring", [entry(2, Closed(SPARE))], False, RuntimeCounts(1, 0, 0))
    await store.flush()
    await asyncio.sleep(0.01)
    later = time.time()
    assert await store.idle_runtimes(None, later) == []
    assert await store.idle_runtimes(later) == ["suspended-expiring"]


async def test_token_counts_before_the_cutoff_go_for_every_tenant_and_later_ones_stay(backend: Backend) -> None:
    store = backend.open()
    counted = [("acme", 100, 1), ("acme", 199, 2), ("acme", 200, 3), ("acme", 260, 4), ("globex", 150, 5), ("globex", 230, 6)]
    for tenant, minute, tokens in counted:
        await store.add_tokens(tenant, minute, tokens, micros=tokens * 1000)
    await store.flush()
    await store.add_tokens("acme", 120, 7)  # not committed yet: it goes too
    await store.forget_tokens_before(200)
    assert await store.tokens_since("acme", 0) == [(200, 3, 3000), (260, 4, 4000)]
    assert await store.tokens_since("globex", 0) == [(230, 6, 6000)]
    if store.durable:  # replicas on one place forget at once: harmless, and counting goes on
        other = backend.open()
        await asyncio.gather(store.forget_tokens_before(201), other.forget_tokens_before(201))
        await other.add_tokens("acme", 260, 10, micros=5)
        await other.flush()
        for reader in (store, other):
            assert await reader.tokens_since("acme", 0) == [(260, 14, 4005)]
            assert await reader.tokens_since("globex", 0) == [(230, 6, 6000)]


async def test_a_create_or_delete_keeps_its_answer_with_its_effect_per_tenant_and_scope(store: Store) -> None:
    """CreateRuntime's and DeleteRuntime's answers (request ids) are kept in the transaction of
    the create or delete: a second answer for the same id and scope is refused, and with it the
    create or the delete, which changes nothing."""
    made = TenantReply("acme", "", "id-1", "CreateRuntime", "d1", "rt-1", time.time())
    await store.create_runtime("acme:rt-1", AGENTS, "acme", reply=made)
    assert await store.reply("acme", "", "id-1") == made
    assert await store.reply("globex", "", "id-1") is None and await store.reply("acme", "rt-1", "id-1") is None
    with pytest.raises(RequestIdTaken):
        await store.create_runtime("acme:rt-2", AGENTS, "acme", reply=dataclasses.replace(made, runtime_id="rt-2"))
    assert await store.runtime_exists("acme:rt-2") is False
    await store.create_runtime("globex:rt-1", AGENTS, "globex", reply=dataclasses.replace(made, tenant="globex"))

    gone = TenantReply("acme", "rt-1", "id-1", "DeleteRuntime", "d2", "rt-1", time.time())
    await store.delete_runtime("acme:rt-1", reply=gone)
    assert await store.runtime_exists("acme:rt-1") is False
    assert await store.reply("acme", "rt-1", "id-1") == gone  # it outlives the runtime
    with pytest.raises(RequestIdTaken):
        await store.delete_runtime("globex:rt-1", reply=dataclasses.replace(gone, tenant="acme"))
    assert await store.runtime_exists("globex:rt-1") is True

    await store.forget_replies_before(time.time() + 1)
    assert await store.reply("acme", "", "id-1") is None and await store.reply("acme", "rt-1", "id-1") is None


# ---- durability --------------------------------------------------------------------------


async def test_flushed_entries_are_read_by_a_second_store_on_the_same_place(backend: Backend) -> None:
    first = backend.open()
    durable_only(first)
    tee = Tee(first)
    lived = await created(tee, "rt-1")
    while not lived.tree.requests:  # suspended: RUNNING no more, a live Request
        assert await lived.step()
    other = await created(tee, "rt-2")
    while not other.tree.running:  # rt-2 is left running
        assert await other.step()
    await first.flush()
    second = backend.open()  # the first stays open (SQLite: a second connection, WAL)
    for runtime_id in ("rt-1", "rt-2"):
        loaded = await second.load(runtime_id)
        assert loaded is not None and loaded.agents == AGENTS
        assert loaded.entries == tee.appended[runtime_id]
        assert await second.entries_after_event(runtime_id, 3) == await first.entries_after_event(runtime_id, 3)
    assert await second.runtimes_with_running_handles() == ["rt-2"]
    loaded = await second.load("rt-1")
    assert loaded is not None
    assert figures(rebuilt("rt-1", loaded.agents, loaded.entries)) == figures(lived.tree)


async def test_a_closed_store_reopens_with_everything_and_carries_on(backend: Backend) -> None:
    first = backend.open()
    durable_only(first)
    tee = Tee(first)
    lived = await created(tee, "rt-1")
    for _ in range(10):
        assert await lived.step()
    await first.close()  # close commits whatever the tick still holds
    second = backend.open()
    stored = await second.load("rt-1")
    assert stored is not None and stored.entries == tee.appended["rt-1"]
    # The journal goes on where it stopped, in the reopened store, as a restarted server does.
    tree = Tree("rt-1", stored.agents)
    journal = Journal.restore(tree, Tee(second), EventLog("rt-1", _no_history), stored.entries)
    assert figures(tree) == figures(lived.tree)
    lived.tree, lived.journal = tree, journal
    lived.groups = story(tree)
    for _ in range(10):
        next(lived.groups)  # the story's groups already recorded (its generator reads the new tree)
    while await lived.step():
        pass
    await second.close()
    third = backend.open()
    final = await third.load("rt-1")
    assert final is not None
    assert [e.seq for e in final.entries] == list(range(1, len(final.entries) + 1))
    assert final.entries[: len(stored.entries)] == stored.entries
    events = [event for e in final.entries for event in events_of(e)]
    assert [event.seq for event in events] == list(range(1, len(events) + 1))  # numbering went on where it stopped
    assert figures(rebuilt("rt-1", final.agents, final.entries)) == figures(tree)
    assert {type(e.step) for e in final.entries} == RECORDED_KINDS


# ---- failures ----------------------------------------------------------------------------


class Unencodable:
    """A value no payload encoding knows (a bug's data in a Request)."""


def failing_appends(seq: int) -> dict[str, list[Entry]]:
    """Appends of a runtime whose journal stops at `seq - 1` that must fail whole: a step
    that cannot be encoded (after one that can), or a seq already stored."""
    bad = PendingRequest("req", "input", data={"object": Unencodable()})
    spawned = Spawned(SPARE, "", "worker", Budget(), "", 1)
    return {
        "unencodable": [entry(seq, spawned), entry(seq + 1, Settled(SPARE, TaskResult(SPARE, pending=bad), HandleState.IDLE))],
        "seq taken": [entry(seq, spawned), entry(1, spawned)],
    }


# Where a backend is known to break this contract: (backend, failure) -> why. Strict: a fix
# makes the test pass, and the entry must go.
KNOWN_FAILING_APPENDS: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize("failure", ["unencodable", "seq taken"])
async def test_a_failing_append_leaves_no_trace_and_spares_the_tick(
    backend: Backend, failure: str, request: pytest.FixtureRequest
) -> None:
    known = KNOWN_FAILING_APPENDS.get((backend.name, failure))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError, reason=known))
    store = backend.open()
    tee = Tee(store)
    a, b = await created(tee, "rt-a"), await created(tee, "rt-b")
    for _ in range(5):
        assert await a.step() and await b.step()
    await store.flush()
    assert await store.runtimes_with_running_handles() == ["rt-a", "rt-b"]
    before_b = list(tee.appended["rt-b"])
    # One event-loop tick: another runtime's append, the failing one, another runtime's
    # append. The failure shows at the append or, for a store that groups a tick's appends,
    # at the flush that follows.
    failed: list[BaseException] = []
    assert await a.step()
    try:
        await store.append("rt-b", failing_appends(len(before_b) + 1)[failure], False)
    except Exception as exc:
        failed.append(exc)
    assert await a.step()
    try:
        await store.flush()
    except Exception as exc:
        failed.append(exc)
    assert failed, f"an append of {failure!r} entries failed nowhere"
    places = [store]
    if store.durable:
        places.append(backend.open())  # what was committed, read afresh
    for place in places:
        loaded_b = await place.load("rt-b")
        assert loaded_b is not None and loaded_b.entries == before_b, "the failed append left a trace"
        loaded_a = await place.load("rt-a")
        assert loaded_a is not None and loaded_a.entries == tee.appended["rt-a"], "the tick's other appends were lost"
        assert await place.runtimes_with_running_handles() == ["rt-a", "rt-b"]  # rt-b's flag did not move
    # The runtime whose append failed goes on: the seqs it tried are still free.
    while await b.step():
        pass
    await store.flush()
    loaded = await store.load("rt-b")
    assert loaded is not None and loaded.entries == tee.appended["rt-b"]


async def test_a_flush_that_returns_covers_every_append_that_returned(backend: Backend, request: pytest.FixtureRequest) -> None:
    """Acknowledged means persisted: once append has returned and a later flush returns,
    the entries are there, whatever another runtime's append did in between."""
    store = backend.open()
    tee = Tee(store)
    a, b = await created(tee, "rt-a"), await created(tee, "rt-b")
    for _ in range(3):
        assert await a.step() and await b.step()
    await store.flush()
    assert await a.step()  # returned: appended
    with contextlib.suppress(Exception):
        await store.append("rt-b", failing_appends(len(tee.appended["rt-b"]) + 1)["seq taken"])
    await asyncio.sleep(0)  # the tick ends (a store that groups a tick's appends writes them now)
    await store.flush()  # returns: everything rt-a appended is durable
    place = backend.open() if store.durable else store
    loaded = await place.load("rt-a")
    assert loaded is not None and loaded.entries == tee.appended["rt-a"]


# ---- a store of release 0.1.0 (SQLite only: the release had no other durable store) ----


async def test_a_release_store_opens_migrated_and_replays(tmp_path: Path) -> None:
    path = tmp_path / "release.db"
    shutil.copyfile(FIXTURE, path)
    store = SqliteStore(str(path))
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)  # migrated to the journal (and on)
        assert await store.runtime_exists("legacy-pending") and await store.runtime_exists("legacy-done")
        expected = {
            "legacy-pending": {
                COORDINATOR: (100, 110, HandleState.SUSPENDED),
                WORKER: (10, 10, HandleState.SUSPENDED),
            },
            "legacy-done": {COORDINATOR: (200, 220, HandleState.IDLE), WORKER: (20, 20, HandleState.IDLE)},
        }
        trees = {}
        taken = 0  # what the runtimes take in the store, their steps encoded as this server encodes them
        for runtime_id, handles in expected.items():
            loaded = await store.load(runtime_id)
            assert loaded is not None
            taken += len(definitions_json(loaded.agents)) + sum(len(encode(e.step)) for e in loaded.entries)
            assert [a.name for a in loaded.agents] == ["coordinator", "worker"]
            kinds = {type(e.step) for e in loaded.entries}
            assert {Spawned, Imported, EventsImported} <= kinds
            tree = trees[runtime_id] = rebuilt(runtime_id, loaded.agents, loaded.entries)
            got = {h.id: (h.usage.own_tokens, h.usage.total_tokens, h.state) for h in tree.handles.values()}
            assert got == handles, runtime_id
            assert tree.running == 0
        pending = trees["legacy-pending"]
        request_id = f"{WORKER}/call_1_1:tool_call"
        assert {r: h.id for r, h in pending.requests.items()} == {request_id: WORKER}
        worker = pending.handles[WORKER]
        assert worker.pending is not None and worker.pending.path == tuple(WORKER.split("/"))
        assert [call.name for call, _ in worker.pending.calls] == ["fetch"]
        done = trees["legacy-done"]
        assert done.requests == {} and list(done.answered) == [request_id]
        assert [m.role for m in done.handles[WORKER].transcript] == ["user", "assistant", "tool", "assistant"]
        events = [event for e in await store.entries_after_event("legacy-done", 0) for event in events_of(e)]
        assert len(events) == 27 and [event.seq for event in events] == list(range(1, 28))
        assert events[0].handle_id == COORDINATOR and events[0].agent == "coordinator"
        later = await store.entries_after_event("legacy-done", 27)
        assert later == []
        assert await store.runtimes_with_running_handles() == []
        # The store-bytes quota counts what the migrated runtimes take (their steps as stored then).
        assert 0.8 * taken < await store.tenant_bytes("default") < 1.2 * taken, taken
    finally:
        await store.close()
    # The migrated store goes on like any other: a reopened store reads the same.
    again = SqliteStore(str(path))
    try:
        loaded = await again.load("legacy-done")
        assert loaded is not None
        assert figures(rebuilt("legacy-done", loaded.agents, loaded.entries)) == figures(trees["legacy-done"])
    finally:
        await again.close()


async def test_a_postgres_store_of_an_earlier_schema_counts_what_its_runtimes_take_once_migrated(database: str) -> None:
    """Migration 3 counts each runtime's definitions and steps, as every later append does."""
    connection = await asyncpg.connect(database)
    try:
        await connection.execute("CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (2)")
        for script in PG_MIGRATIONS[:2]:
            await connection.execute(script)
        definitions = definitions_json(AGENTS)
        for runtime_id, tenant in (("acme:rt", "acme"), ("bolt:rt", "bolt")):
            await connection.execute(
                "INSERT INTO runtimes (id, agents, created_at, tenant, updated_at) VALUES ($1, $2, 1, $3, 1)",
                runtime_id,
                definitions.decode(),
                tenant,
            )
        steps = [encode(Spawned(SPARE, "", "worker", Budget(), "", 1)), encode(Posted(SPARE, InboxItem("x" * 900, "c", "s")))]
        for seq, step in enumerate(steps, start=1):
            await connection.execute("INSERT INTO journal VALUES ('acme:rt', $1, 1, $1, $1, $2)", seq, step)
    finally:
        await connection.close()
    store = PostgresStore(database)
    try:
        assert await store.tenant_bytes("acme") == len(definitions) + sum(map(len, steps))
        assert await store.tenant_bytes("bolt") == len(definitions)
        await store.append("acme:rt", [entry(3, Closed(SPARE))])
        await store.flush()
        assert await store.tenant_bytes("acme") == len(definitions) + sum(map(len, steps)) + len(encode(Closed(SPARE)))
    finally:
        await store.close()


# ---- a server on PostgreSQL ---------------------------------------------------------------


async def test_a_server_on_postgres_serves_and_a_restarted_one_still_has_the_result(
    database: str, model: ScriptedModelServer
) -> None:
    url = database
    model.script("writer", lambda body: Reply(text="written", tokens=12))
    settings: dict[str, Any] = {"llm_style": "openai", "llm_base_url": model.base_url, "store": url}
    async with serve(**settings) as served:
        runtime_id = await create(served.stub, agent("writer"))
        handle_id, result = await run(served.stub, runtime_id, "writer", "go")
        assert result.text == "written" and result.status == pb.STATUS_DONE
    async with serve(**settings) as served:  # a restart on the same database
        waited = await served.stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=30)
        assert waited.result == result
