"""The state the journal builds from its steps (replay.py applies them)."""

from __future__ import annotations

from typing import NamedTuple

from ..billing.usage import NO_COST, Cost, Tokens
from ..vocabulary import AgentSpec, Answer, HandleState, RuntimeOptions
from .handle import Handle
from .recording import Recording
from .replied import Replied

REPLIES_KEPT = 1000  # a runtime's answered request ids kept, newest last (AGENTRUNTIME_REQUEST_IDS_KEPT)


class ReplyBook:
    """The answers to a runtime's calls made with request ids, by id: the newest `limit`
    (the oldest goes first), each with the time it was recorded (a repeat finds it only
    within the request id TTL)."""

    def __init__(self, limit: int = REPLIES_KEPT) -> None:
        self.limit = limit
        self._by_id: dict[str, tuple[Replied, float]] = {}

    def add(self, replied: Replied, at: float) -> None:
        self._by_id.pop(replied.request_id, None)
        self._by_id[replied.request_id] = (replied, at)
        while len(self._by_id) > self.limit:
            del self._by_id[next(iter(self._by_id))]

    def find(self, request_id: str, recorded_since: float) -> Replied | None:
        found = self._by_id.get(request_id)
        return found[0] if found is not None and found[1] >= recorded_since else None

    def __len__(self) -> int:
        return len(self._by_id)


class RuntimeCounts(NamedTuple):
    """What ListRuntimes shows of a runtime, kept in its store row: its handles, those in
    flight and those suspended, and what all of them spent (absolute figures: a write
    replaces them)."""

    handles: int = 0
    running: int = 0
    suspended: int = 0
    tokens: int = 0
    cost_micros: int = 0
    cost_currency: str = ""
    cost_priced: bool = True


NO_COUNTS = RuntimeCounts()


class Tree:
    """The state the journal builds: every handle, and the indexes over them."""

    def __init__(self, runtime_id: str, agents: tuple[AgentSpec, ...], replies_kept: int = REPLIES_KEPT) -> None:
        self.runtime_id = runtime_id
        self.agents = {agent.name: agent for agent in agents}
        self.handles: dict[str, Handle] = {}
        self.top_level_per_agent: dict[str, int] = {}
        # Live Requests by id -> the handle that made them.
        self.requests: dict[str, Handle] = {}
        # Answered Requests by id -> (the answer, the id of the handle it answered).
        self.answered: dict[str, tuple[Answer, str]] = {}
        # Answered Requests by id -> the topmost handle its Resume continued so far (a retried
        # Resume answers with that handle's result). Derived, with Handle.mark, from the steps:
        # `clock` orders the Answered and Settled steps applied.
        self.resumed_top: dict[str, str] = {}
        self.clock = 0
        self.running = 0  # handles with a run in flight (RUNNING or QUEUED)
        self.beating = 0  # open handles with a heartbeat
        self.suspended = 0
        self.spent_tokens = 0  # by every handle, as ListRuntimes shows it
        self.spent_cost = NO_COST
        self.options = RuntimeOptions()
        self.replies = ReplyBook(replies_kept)  # the answers of the host's calls made with request ids
        self.origin: tuple[str, int] | None = None  # a fork's source and cut; a replay's recording and 0
        self.replaying: Recording | None = None  # a replay's recording (forks.Replaying)

    @property
    def held(self) -> list[Handle]:
        return [handle for handle in self.handles.values() if handle.state is HandleState.HELD]

    def changed_state(self, before: HandleState, after: HandleState, beats: bool = False) -> None:
        """Keeps the counts the store indexes: handles in flight (runtimes to recover),
        suspended ones, and open handles with a heartbeat (`beats`: this one has one)."""
        self.running += after.in_flight - before.in_flight
        self.suspended += (after is HandleState.SUSPENDED) - (before is HandleState.SUSPENDED)
        if beats:
            self.beating -= (after is HandleState.CLOSED) - (before is HandleState.CLOSED)

    def spent(self, tokens: Tokens, cost: Cost) -> None:
        self.spent_tokens += tokens.total
        self.spent_cost = self.spent_cost.plus(cost)

    @property
    def counts(self) -> RuntimeCounts:
        """What ListRuntimes shows of the runtime."""
        cost = self.spent_cost
        return RuntimeCounts(
            len(self.handles), self.running, self.suspended, self.spent_tokens, cost.micros, cost.currency, cost.priced
        )

    @property
    def active(self) -> bool:
        """The runtime needs a process: a run is in flight, a heartbeat is due or a live
        Request lapses (the store's `running` flag, by which a starting server finds the
        runtimes to load)."""
        return self.running > 0 or self.beating > 0 or self.expiring

    @property
    def expiring(self) -> bool:
        """A live Request has an expiry: when it passes unanswered, the call's result is an
        error and the run goes on, which takes a process."""
        return any(handle.pending is not None and handle.pending.expires_at is not None for handle in self.requests.values())
