"""`memory://`: the store kept in lists, for tests. Nothing survives the process."""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from ..domain.errors import RequestIdTaken, RuntimeExists
from ..domain.journal import Entry
from ..domain.journal.tree import NO_COUNTS, RuntimeCounts
from ..domain.ports import Origin, RuntimeRow, StoredRuntime, TenantReply
from ..domain.tenancy.quotas import runtimes_quota_reached
from ..domain.vocabulary import AgentSpec
from .payloads import definitions_json, journal_rows, payload_bytes


@dataclass
class _Runtime:
    agents: tuple[AgentSpec, ...]
    tenant: str
    created_at: float
    counts: RuntimeCounts = NO_COUNTS
    updated_at: float = 0.0
    entries: list[Entry] = field(default_factory=list)
    last_events: list[int] = field(default_factory=list)  # each entry's last event, for bisect
    running: bool = False
    bytes: int = 0  # its definitions' JSON and its steps' payloads
    forked_from: str = ""
    fork_seq: int = 0

    def add(self, entries: Sequence[Entry], size: int) -> None:
        self.bytes += size
        for entry in entries:
            self.entries.append(entry)
            self.last_events.append(max(entry.last_event, self.last_events[-1] if self.last_events else 0))

    def idle(self, before: float | None, suspended_before: float | None) -> bool:
        cutoff = suspended_before if self.counts.suspended else before
        return cutoff is not None and self.updated_at < cutoff and not self.running


class MemoryStore:
    durable = False

    def __init__(self) -> None:
        self._runtimes: dict[str, _Runtime] = {}
        self._tokens: dict[tuple[str, int], tuple[int, int]] = {}  # (tenant, minute) -> (tokens, micros)
        self._replies: dict[tuple[str, str, str], TenantReply] = {}

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
        if runtime_id in self._runtimes:
            raise RuntimeExists(runtime_id)
        if quota and await self.count_runtimes(tenant) >= quota:
            raise runtimes_quota_reached(tenant, quota)
        self._keep(reply)
        rows, _ = journal_rows(runtime_id, 1, entries)  # held to what a durable store can keep
        now = time.time()
        self._runtimes[runtime_id] = _Runtime(agents, tenant, now, updated_at=now)
        if origin is not None:
            created = self._runtimes[runtime_id]
            created.forked_from, created.fork_seq = origin.forked_from, origin.fork_seq
            created.counts, created.running = origin.counts, origin.running
        self._runtimes[runtime_id].add(entries, len(definitions_json(agents)) + payload_bytes(rows))

    async def runtime_exists(self, runtime_id: str) -> bool:
        return runtime_id in self._runtimes

    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: RuntimeCounts | None = None,
    ) -> None:
        runtime = self._runtimes[runtime_id]
        rows, _ = journal_rows(runtime_id, len(runtime.entries) + 1, entries)  # held to what a durable store can keep
        runtime.add(entries, payload_bytes(rows))
        if running is not None:
            runtime.running = running
        if counts is not None:
            runtime.counts = counts
        runtime.updated_at = time.time()

    async def load(self, runtime_id: str) -> StoredRuntime | None:
        runtime = self._runtimes.get(runtime_id)
        return None if runtime is None else StoredRuntime(runtime.agents, list(runtime.entries))

    async def load_until(self, runtime_id: str, upto_event: int) -> StoredRuntime | None:
        runtime = self._runtimes.get(runtime_id)
        if runtime is None:
            return None
        return StoredRuntime(runtime.agents, list(itertools.takewhile(lambda e: e.first_event <= upto_event, runtime.entries)))

    async def entries_after_event(self, runtime_id: str, after_event: int, limit: int | None = None) -> list[Entry]:
        runtime = self._runtimes[runtime_id]
        start = bisect.bisect_right(runtime.last_events, after_event)
        end = None if limit is None else start + limit
        return [entry for entry in runtime.entries[start:end] if entry.last_event > after_event]

    async def list_runtimes(
        self, tenant: str, after: tuple[float, str] | None, limit: int, forks_of: str = ""
    ) -> list[RuntimeRow]:
        ordered = sorted(
            (
                (runtime.created_at, key)
                for key, runtime in self._runtimes.items()
                if runtime.tenant == tenant and (not forks_of or runtime.forked_from == forks_of)
            ),
            reverse=True,
        )
        rows = [position for position in ordered if after is None or position < after][:limit]
        return [self._row(key) for _, key in rows]

    def _row(self, key: str) -> RuntimeRow:
        runtime = self._runtimes[key]
        return RuntimeRow(key, runtime.tenant, runtime.created_at, runtime.counts, runtime.forked_from, runtime.fork_seq)

    async def delete_runtime(self, runtime_id: str, reply: TenantReply | None = None) -> None:
        self._keep(reply)
        self._runtimes.pop(runtime_id, None)

    def _keep(self, reply: TenantReply | None) -> None:
        if reply is not None:
            key = (reply.tenant, reply.scope, reply.request_id)
            if key in self._replies:
                raise RequestIdTaken(f"request id {reply.request_id!r} was answered already")
            self._replies[key] = reply

    async def reply(self, tenant: str, scope: str, request_id: str) -> TenantReply | None:
        return self._replies.get((tenant, scope, request_id))

    async def forget_replies_before(self, at: float) -> None:
        self._replies = {key: reply for key, reply in self._replies.items() if reply.at >= at}

    async def idle_runtimes(self, before: float | None, suspended_before: float | None = None) -> list[str]:
        return [key for key, runtime in self._runtimes.items() if runtime.idle(before, suspended_before)]

    async def delete_if_idle(self, runtime_id: str, before: float | None, suspended_before: float | None = None) -> bool:
        runtime = self._runtimes.get(runtime_id)
        if runtime is None or not runtime.idle(before, suspended_before):
            return False
        del self._runtimes[runtime_id]
        return True

    async def count_runtimes(self, tenant: str) -> int:
        return sum(1 for runtime in self._runtimes.values() if runtime.tenant == tenant)

    async def tenant_bytes(self, tenant: str) -> int:
        return sum(runtime.bytes for runtime in self._runtimes.values() if runtime.tenant == tenant)

    async def add_tokens(self, tenant: str, minute: int, tokens: int, micros: int = 0) -> None:
        spent, cost = self._tokens.get((tenant, minute), (0, 0))
        self._tokens[(tenant, minute)] = (spent + tokens, cost + micros)

    async def tokens_since(self, tenant: str, minute: int) -> list[tuple[int, int, int]]:
        return sorted((at, *spent) for (owner, at), spent in self._tokens.items() if owner == tenant and at >= minute)

    async def forget_tokens_before(self, minute: int) -> None:
        self._tokens = {key: tokens for key, tokens in self._tokens.items() if key[1] >= minute}

    async def runtimes_with_running_handles(self) -> list[str]:
        return sorted(runtime_id for runtime_id, runtime in self._runtimes.items() if runtime.running)

    def forget(self, runtime_id: str) -> None:
        pass  # it keeps every runtime (nothing leaves the memory of a store that is not durable)

    async def flush(self, runtime_id: str | None = None) -> None:
        pass

    def on_health(self, callback: Callable[[bool], None]) -> None:
        pass  # nothing to commit, nothing that fails

    def on_unwritten(self, callback: Callable[[Collection[str]], None]) -> None:
        pass

    async def close(self) -> None:
        self._runtimes.clear()
