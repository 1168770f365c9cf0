"""What the fast tier's tests of tenants, quotas and request ids share, beside the harness
(tests/domain/harness.py): a refusal read for the tenant and the quota it names, a trace of the
events a runtime tells its observers, a process restarted over the same store, and what a
runtime has written (to see that a refusal wrote nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentruntime_server.domain.errors import InvalidArgument
from agentruntime_server.domain.journal.events import Event, EventKind
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.runtime.service import RuntimeService
from agentruntime_server.domain.tenancy.quotas import QuotaExceeded
from agentruntime_server.domain.vocabulary import HandleState

from tests.domain.harness import Bench


def quota_refusal(raised: BaseException, tenant: str, quota: str) -> str:
    """The refusal is the tenant's quota, named as the wire's QuotaFailure names it; its message."""
    assert isinstance(raised, QuotaExceeded), repr(raised)
    assert (raised.subject, raised.quota, raised.reason) == (f"tenant:{tenant}", quota, "QUOTA_EXCEEDED"), raised
    message = str(raised)
    assert f"tenant {tenant!r}" in message and f"AGENTRUNTIME_QUOTA_{quota.upper()}" in message, message
    return message


def reused(raised: BaseException) -> bool:
    """The refusal of a request id sent before with another request (or another call)."""
    return (
        isinstance(raised, InvalidArgument)
        and raised.reason == "REQUEST_ID_REUSED"
        and [violation.field for violation in raised.violations] == ["request_id"]
    )


@dataclass
class Trace:
    """An Observer (Services.observers): every event the runtimes tell, in order."""

    events: list[Event] = field(default_factory=list)

    def __call__(self, runtime_key: str, event: Event) -> None:
        self.events.append(event)

    def states(self, state: HandleState) -> list[str]:
        """The handles that went into `state`, in the order they did."""
        return [e.handle_id for e in self.events if e.kind is EventKind.STATE_CHANGED and e.state is state]

    def turns_started(self) -> list[str]:
        return [e.handle_id for e in self.events if e.kind is EventKind.TURN_STARTED]

    def peak_turns(self) -> int:
        """The most model turns under way at once, over every handle."""
        now = peak = 0
        for event in self.events:
            if event.kind is EventKind.TURN_STARTED:
                now += 1
                peak = max(peak, now)
            elif event.kind is EventKind.TURN_ENDED:
                now -= 1
        return peak


def restarted(bench: Bench, quotas_for: Callable[[str], dict[str, int] | None] | None = None) -> Bench:
    """Another process's service over the same store and clock: what it knows it read from the
    store (a restart, or a replica), nothing of the first one's memory. `quotas_for`: tenants'
    own quotas (a tokens file's), over the server's."""
    return Bench(bench.clock, bench.store, bench.tools, RuntimeService(bench.service.services, quotas_for=quotas_for))


async def written(bench: Bench, runtime: Runtime) -> int:
    """The steps the store holds of the runtime."""
    stored = await bench.store.load(runtime.key)
    assert stored is not None, runtime.key
    return len(stored.entries)
