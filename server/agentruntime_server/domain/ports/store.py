"""The persistence seam, and the leases of replicas. Implementations: store/."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..journal import Entry
from ..journal.tree import RuntimeCounts
from ..ownership import Claim
from ..vocabulary import (
    AgentSpec,
)


@dataclass(frozen=True)
class RuntimeRow:
    runtime_id: str  # the store's key
    tenant: str
    created_at: float
    counts: RuntimeCounts
    forked_from: str = ""  # the tenant's id of the runtime it was forked (or replayed) from
    fork_seq: int = 0  # a fork's cut: the last event of the source it holds


@dataclass(frozen=True)
class Origin:
    """A runtime created from another's journal (a fork, a replay): where it came from, and
    its figures and running flag as its first entries leave them (a new runtime's are nil)."""

    forked_from: str  # the tenant's id of the source
    fork_seq: int  # a fork's cut; 0 for a replay
    counts: RuntimeCounts
    running: bool


@dataclass(frozen=True)
class TenantReply:
    """The answer to a CreateRuntime or a DeleteRuntime made with a request id, kept per tenant
    (the runtime it names may not exist yet, or no more): `scope` is "" for CreateRuntime and
    the deleted runtime's id for DeleteRuntime; `runtime_id` is the tenant's id of the runtime
    the call created or deleted."""

    tenant: str
    scope: str
    request_id: str
    rpc: str
    digest: str
    runtime_id: str
    at: float


@dataclass
class StoredRuntime:
    agents: tuple[AgentSpec, ...]
    entries: list[Entry]  # the whole journal, in order


class Store(Protocol):
    """Where the journal goes: the source of truth after a restart.

    The contract is small on purpose (a second backend implements it, and one
    conformance suite, tests/store/test_store_contract.py, holds every backend to it): a runtime
    is its definitions plus its journal, appended in order and read back whole. Appends
    may be grouped into one transaction; `flush` makes everything appended so far durable,
    and runs before an effect leaves the process (an RPC's reply, a watched event, a
    side-effecting tool call)."""

    durable: bool  # False: nothing survives the process, so nothing is evicted from memory

    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        tenant: str = "default",
        entries: Sequence[Entry] = (),
        quota: int = 0,
        reply: TenantReply | None = None,
        origin: Origin | None = None,
    ) -> None:
        """`origin`: where a fork or a replay came from, kept in its row for listings.
        `runtime_id` is the store's key, unique over every tenant (AlreadyExists).
        `reply`: the call's answer, kept in the same transaction (errors.RequestIdTaken, and
        nothing created, if the tenant's scope holds that request id already).
        `entries`: its first journal entries, seq 1 on, stored with it in one transaction: a
        runtime is never read back without them; appends go on after them. `quota` (0: none):
        QuotaExceeded if the tenant has that many runtimes already, counted and inserted in
        one step against every process sharing the store."""
        ...

    async def runtime_exists(self, runtime_id: str) -> bool: ...

    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: RuntimeCounts | None = None,
    ) -> None:
        """The entries, after every entry appended before (atomically, in order).
        `running`: whether the runtime now needs a process (None: unchanged); `counts`: its
        figures now, for listings (None: unchanged)."""
        ...

    async def list_runtimes(
        self, tenant: str, after: tuple[float, str] | None, limit: int, forks_of: str = ""
    ) -> list[RuntimeRow]:
        """A tenant's runtimes, newest first, after the (created_at, runtime_id) cursor
        (`forks_of`: only those forked or replayed from the runtime of that tenant's id)."""
        ...

    async def delete_runtime(self, runtime_id: str, reply: TenantReply | None = None) -> None:
        """Every stored row of the runtime; and `reply` kept, in the same transaction
        (errors.RequestIdTaken, and nothing deleted, if its scope holds that request id already)."""
        ...

    async def reply(self, tenant: str, scope: str, request_id: str) -> TenantReply | None:
        """The answer kept for a tenant's request id in a scope, if any (however old)."""
        ...

    async def forget_replies_before(self, at: float) -> None:
        """Deletes every tenant's answers kept before `at`. Harmless when run again, or at once."""
        ...

    async def idle_runtimes(self, before: float | None, suspended_before: float | None = None) -> list[str]:
        """The runtimes retention may delete, of every tenant: nothing running (the `running`
        flag of append is false), and not written since `before` if no handle is SUSPENDED,
        or since `suspended_before` if one is (its counts say so). A cutoff of None: that
        kind is never idle."""
        ...

    async def delete_if_idle(self, runtime_id: str, before: float | None, suspended_before: float | None = None) -> bool:
        """Deletes the runtime as delete_runtime does, but only if idle_runtimes would list it
        now, with the same cutoffs: checked and deleted in one step, and an append not yet
        committed counts as a write. A runtime written after a listing is kept. True: it was
        deleted."""
        ...

    async def count_runtimes(self, tenant: str) -> int: ...

    async def tenant_bytes(self, tenant: str) -> int:
        """The bytes the tenant's runtimes take in the store: each one's definitions (their JSON)
        plus its journal's steps (their payloads, store/payloads.py, and whatever framing the
        backend stores them in: SQLite's group rows), as of the last flush, or later. Cheap:
        kept per runtime as it grows, never summed over a journal."""
        ...

    async def add_tokens(self, tenant: str, minute: int, tokens: int, micros: int = 0) -> None:
        """A tenant's model tokens and what they cost (micro-units), counted in a minute
        (written with the tick's journal)."""
        ...

    async def tokens_since(self, tenant: str, minute: int) -> list[tuple[int, int, int]]:
        """A tenant's (minute, tokens, micros) from `minute` on."""
        ...

    async def forget_tokens_before(self, minute: int) -> None:
        """Deletes every tenant's counts of minutes before `minute` (tokens added so far
        included). Harmless when run again, or at once by replicas on one database."""
        ...

    async def load(self, runtime_id: str) -> StoredRuntime | None: ...

    async def load_until(self, runtime_id: str, upto_event: int) -> StoredRuntime | None:
        """A runtime's definitions and its journal's first entries, as load has them: every
        entry whose first event is `upto_event` or before (so the one that made that event, and
        every entry before it), and none after. A read alone: the store learns nothing of the
        runtime from it (a fork reads its source so: domain/runtime/forks.py)."""
        ...

    async def entries_after_event(self, runtime_id: str, after_event: int, limit: int | None = None) -> list[Entry]:
        """Every entry that made an event numbered above `after_event`, in order (and the
        entries without events between them); with `limit`, only the first `limit` of them.
        A watcher pages its history so (domain/watching/event_log.py), each page read after the last
        event of the one before; a page costs the same however far into the journal it starts."""
        ...

    async def runtimes_with_running_handles(self) -> list[str]: ...

    def forget(self, runtime_id: str) -> None:
        """The runtime left this process's memory: what the store kept of it to append faster
        (its next seq) goes, once nothing of it is left to commit; it is read again at the
        runtime's next append (after a load, which reads its journal)."""
        ...

    async def flush(self, runtime_id: str | None = None) -> None:
        """Everything appended so far is durable. `runtime_id`: and that runtime's writes were
        accepted (errors.Fenced: a store shared by replicas once its lease is lost; PostgreSQL
        also once the runtime's row is gone, deleted by another process)."""
        ...

    def on_health(self, callback: Callable[[bool], None]) -> None:
        """`callback(False)` when the store can take no more writes, `callback(True)` when it
        can again. PostgreSQL: its database went away (errors.StoreUnavailable meanwhile),
        then came back. SQLite: a write failed for want of space or I/O (errors.StoreCannotWrite
        meanwhile), then one went through; or a commit failed past mending, and it takes
        nothing more until the server is restarted (errors.StoreBroken)."""
        ...

    def on_unwritten(self, callback: Callable[[Collection[str]], None]) -> None:
        """`callback(keys)`: the store did not take these runtimes' last writes (a commit that
        failed, an append while it was away): their copies in memory are ahead of it and must
        stop; the store has forgotten whatever else of theirs it still buffered."""
        ...

    async def close(self) -> None: ...


class Leases(Protocol):
    """Which process executes which runtime. One process on its own store owns every runtime
    (ownership.SoleOwner); replicas sharing a database hold a lease per runtime, with a
    fencing epoch the store checks on every journal write (store/postgres/leases.py)."""

    shared: bool  # True: other processes may execute runtimes of this store

    async def claim(self, runtime_id: str) -> Claim:
        """Takes the runtime's lease unless a live replica holds it. A claim always starts a
        new epoch: writes of any earlier holder, this process's included, are refused."""
        ...

    async def start(self) -> None:
        """This process takes part from now on (replicas: it is registered, live)."""
        ...

    async def confirm(self) -> None:
        """Makes sure `holds` is current: renews first if the leases may have lapsed."""
        ...

    def holds(self, runtime_id: str) -> bool:
        """This process still holds the runtime's lease, as far as it knows (no I/O)."""
        ...

    async def release(self, runtime_id: str) -> None:
        """Gives the lease up (its journal flushed first); another replica may claim it."""
        ...

    async def release_all(self) -> None:
        """Gives every lease of this process up (a graceful shutdown: no lease lapses)."""
        ...

    async def renew(self) -> list[str]:
        """Keeps this process's leases alive; returns the runtimes it turned out to have lost."""
        ...

    async def orphans(self) -> list[str]:
        """Runtimes with running handles that no live replica holds (a dead one's)."""
        ...

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """`callback(runtime_id)` whenever a write of that runtime is refused (fenced)."""
        ...
