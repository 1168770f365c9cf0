"""A Watch hunt: several Watch streams open at once on one runtime while seeded random batches
of verbs run on it.

The verbs and the model are the race hunt's (tests/e2e/test_race_hunt.py, the model in
tests/support/hunt.py): Spawn, Wake, Post, Interrupt, Close (plain, force, grace), Resume and
Wait at a few handles of one runtime on a real server (SQLite file store, and PostgreSQL)
whose OpenAI-shaped model answers after small random delays; a `lead` delegates through the
`task` tool to children that suspend on a relay call or on `ask`. Meanwhile a few Watch streams follow the runtime: opened from 0,
from a seq in the middle or from the latest seq seen; some read slowly, so that with a small
AGENTRUNTIME_WATCH_BUFFER they fall behind and are told WATCH_LAGGING; some are cancelled and
opened again from the last seq they saw; every few rounds the server restarts on the same
store (at rest, or with runs in flight), which ends every stream with UNAVAILABLE, and each
is opened again on the new server from its last seq. At the end the runtime is deleted with
the streams open.

What is checked, each as the README and the proto say it:
- every stream's events come one by one from its `after_seq` on, no gap, none twice, across
  every re-open (after a cancel, a WATCH_LAGGING, a restart): a re-opened stream goes on
  exactly where the one before left off, and a WATCH_LAGGING names that seq as `after_seq`;
- a stream ends only as documented: RESOURCE_EXHAUSTED WATCH_LAGGING, UNAVAILABLE at a
  shutdown, NOT_FOUND after DeleteRuntime; never another code, and never on its own;
- at rest (nothing RUNNING or QUEUED), every open stream reaches the runtime's last event,
  and what any stream ever saw is, event for event, what a fresh Watch from 0 sends;
- that history read in order is consistent on its own: each handle spawned once, before its
  other events, under a parent spawned before it; a TurnStarted numbers the handle's next
  turn; a TurnEnded's figures are the handle's own tokens and its subtree's tokens so far; a
  result's turns, own and total tokens and tool calls are the handle's as its events tell
  them; no figure an event reports for a handle goes down;
- the state and figures the events imply for each handle at rest (its last StateChanged;
  its TurnEnded and ToolCallEnded events; its subtree's tokens) are what List says;
- Watch past the last event is INVALID_ARGUMENT.

Short in CI; a long hunt locally (the seed is in every failure):
    AGENTRUNTIME_WATCH_HUNT_ROUNDS=300 AGENTRUNTIME_WATCH_HUNT_SEED=7 pytest tests/e2e/test_watch_hunt.py"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import duration
from tests.support.hunt import AGENTS, TOP_AGENTS, Model, ServerErrors, random_answer, reason_of, server_errors, short, store_url
from tests.support.model_server import ScriptedModelServer
from tests.support.servers import Served, serve
from tests.support.timeouts import for_rounds

__all__ = ["server_errors", "store_url"]  # the hunts' fixtures (tests/support/hunt.py), used here

ROUNDS = int(os.environ.get("AGENTRUNTIME_WATCH_HUNT_ROUNDS", "24"))
SEED = int(os.environ.get("AGENTRUNTIME_WATCH_HUNT_SEED", str(random.randrange(1 << 30))))
EPOCH = 8  # rounds between two rests (each followed by a restart)
# Rounds take a few hundredths of a second here: 2 s each before the hunt is called hung.
pytestmark = for_rounds(ROUNDS, 2.0)
RUNTIME = "watched"
TOPS = 4  # open top-level handles at most
STREAMS = 4  # Watch streams open at once
BUFFER = 8  # AGENTRUNTIME_WATCH_BUFFER: small, so that a slow stream falls behind
CALL_TIMEOUT = 20.0  # a call that takes this long is stuck: a finding, not a slow machine
SETTLE = 20.0  # seconds the runtime gets to come to rest, and a stream to catch up
Code = grpc.StatusCode
S = pb.HandleState
IN_FLIGHT = {S.HANDLE_STATE_RUNNING, S.HANDLE_STATE_QUEUED}
# What a verb may end with here: a caller's refusal, or NOT_FOUND only for a handle it cannot know.
REFUSALS = {Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.RESOURCE_EXHAUSTED}
LAGGING_HINT = re.compile(r"after_seq=(\d+)")
LAST_EVENT = re.compile(r"past the runtime's last event \((\d+)\)")


# ---- a stream -----------------------------------------------------------------------------------


@dataclass
class Stream:
    """One consumer of Watch, over as many calls as it takes (it re-opens from its last seq)."""

    name: str
    start: int  # the after_seq of its first call
    slow: float  # up to this many seconds between two reads
    rng: random.Random
    last: int = -1
    seen: dict[int, pb.Event] = field(default_factory=dict)
    calls: int = 0
    task: asyncio.Task[None] | None = None
    ended: str = ""  # how its last call ended (a code name, `cancelled`)
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.last = self.start


@dataclass
class Hunt:
    model: Model
    rng: random.Random
    stub: pb_grpc.AgentRuntimeAsyncStub = field(init=False)
    streams: list[Stream] = field(default_factory=list)  # open ones
    retired: list[Stream] = field(default_factory=list)
    tops: list[str] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)
    children: list[str] = field(default_factory=list)
    live: dict[str, pb.Request] = field(default_factory=dict)
    ending: str = ""  # what every stream's call may end with now: `UNAVAILABLE` (a shutdown), `NOT_FOUND` (a delete)
    violations: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    round: int = 0
    names: int = 0
    grace: float | None = None
    stopped_at: float = 0.0  # when the last shutdown began (time.monotonic)
    started: float = field(default_factory=time.monotonic)

    def flag(self, what: str) -> None:
        self.violations.append(f"round {self.round} (seed {SEED}): {what}")

    @property
    def latest(self) -> int:
        """The latest seq any stream has seen."""
        return max([s.last for s in self.streams + self.retired] + [0])

    # -- streams --------------------------------------------------------------------------------

    def open(self, start: int | None = None, slow: float | None = None) -> Stream:
        if start is None:
            roll = self.rng.random()
            start = 0 if roll < 0.3 else self.latest if roll < 0.65 else self.rng.randint(0, self.latest)
        if slow is None:
            slow = self.rng.choice([0.0, 0.0, 0.005, 0.03])
        self.names += 1
        stream = Stream(f"s{self.names}", start, slow, random.Random(self.rng.getrandbits(32)))
        self.streams.append(stream)
        self.follow(stream)
        self.stats["stream opened"] += 1
        return stream

    def follow(self, stream: Stream) -> None:
        stream.task = asyncio.get_running_loop().create_task(self._follow(stream))

    async def _follow(self, stream: Stream) -> None:
        """Reads until the call ends; re-opens from its last seq after a WATCH_LAGGING."""
        while True:
            stream.calls += 1
            call = self.stub.Watch(pb.WatchRequest(runtime_id=RUNTIME, after_seq=stream.last))
            got = 0
            try:
                async for response in call:
                    event = response.event
                    if event.seq != stream.last + 1:
                        self.flag(
                            f"stream {stream.name} (call {stream.calls}, from {stream.start}) got seq {event.seq} "
                            f"after {stream.last}: {'a gap' if event.seq > stream.last else 'a repeat'}"
                        )
                    stream.seen[event.seq] = event
                    got += 1
                    stream.last = max(stream.last, event.seq)
                    stream.moved.set()
                    if stream.slow and not self.ending:  # (at a shutdown it reads what was sent within the grace)
                        await asyncio.sleep(stream.rng.uniform(0, stream.slow))  # a slow consumer, not a wait for anything
                self.flag(f"stream {stream.name}: a Watch call ended OK on its own at seq {stream.last}")
                stream.ended = "OK"
                return
            except asyncio.CancelledError:
                stream.ended = "cancelled"
                raise
            except grpc.aio.AioRpcError as error:
                code, reason, message = error.code(), reason_of(error), error.details() or ""
                stream.ended = code.name
                self.stats[f"stream ended {code.name} {reason}"] += 1
                if code is Code.RESOURCE_EXHAUSTED and reason == "WATCH_LAGGING":
                    hint = LAGGING_HINT.search(message)
                    if hint is None or int(hint.group(1)) != stream.last:
                        self.flag(f"stream {stream.name}: WATCH_LAGGING at seq {stream.last} says {message!r}")
                    if hint is not None:
                        stream.last = int(hint.group(1))  # as a client would: from the seq it names
                    continue
                early = self.grace is not None and time.monotonic() - self.stopped_at < self.grace / 2
                if code is Code.CANCELLED and got == 0 and self.ending == "UNAVAILABLE" and early:
                    # A call that reached the server as it began to stop, before grpc handed it to
                    # a handler: grpc-core ends such pending calls CANCELLED at once, not UNAVAILABLE
                    # (grpc/grpc#41785). No handler of ours ran. (A handler of ours stuck until the
                    # grace ran out would be CANCELLED too, but only at its end: still a finding.)
                    self.stats["stream ended CANCELLED before a handler ran (grpc/grpc#41785)"] += 1
                    stream.ended = self.ending  # the shutdown's end, as grpc tells it (the clients retry it)
                    return
                if code.name != self.ending:
                    self.flag(
                        f"stream {stream.name} at seq {stream.last} ended {code.name} {reason}: {message!r} "
                        f"(call {stream.calls}, {got} events in it, {self.ending or 'no end'} due, grace {self.grace})"
                    )
                return

    async def cancel(self, stream: Stream) -> None:
        assert stream.task is not None
        stream.task.cancel()
        await asyncio.gather(stream.task, return_exceptions=True)

    async def shuffle_streams(self) -> None:
        """Between batches: a stream cancelled and opened again, one retired and a new one opened."""
        roll = self.rng.random()
        if self.streams and roll < 0.3:
            stream = self.rng.choice(self.streams)
            await self.cancel(stream)
            self.stats["stream cancelled and re-opened"] += 1
            self.follow(stream)
        elif len(self.streams) > 1 and roll < 0.45:
            stream = self.rng.choice(self.streams[1:])  # the first one always goes on from 0
            await self.cancel(stream)
            self.streams.remove(stream)
            self.retired.append(stream)
            self.open()
        if self.rng.random() < 0.1:
            await self.past_the_end()

    async def past_the_end(self) -> None:
        """A seq past the runtime's last event is INVALID_ARGUMENT (not a stream that waits for ever)."""
        beyond = 1 << 40
        call = self.stub.Watch(pb.WatchRequest(runtime_id=RUNTIME, after_seq=beyond))
        try:
            async for response in call:
                self.flag(f"Watch(after_seq={beyond}) sent {response.event}")
                break
        except grpc.aio.AioRpcError as error:
            if error.code() is not Code.INVALID_ARGUMENT:
                self.flag(f"Watch(after_seq={beyond}) ended {error.code().name}: {error.details()!r}")
            return
        finally:
            call.cancel()

    async def last_event(self) -> int:
        """The runtime's last event, as Watch tells it (a seq past it is INVALID_ARGUMENT, naming it)."""
        call = self.stub.Watch(pb.WatchRequest(runtime_id=RUNTIME, after_seq=1 << 40))
        try:
            async for _ in call:
                break
        except grpc.aio.AioRpcError as error:
            found = LAST_EVENT.search(error.details() or "")
            if error.code() is Code.INVALID_ARGUMENT and found:
                return int(found.group(1))
            raise AssertionError(f"Watch past the end: {error.code().name} {error.details()!r}") from None
        raise AssertionError("Watch past the end sent an event")

    # -- verbs ----------------------------------------------------------------------------------

    async def call(self, verb: str, request: Any) -> Any:
        try:
            reply = await getattr(self.stub, verb)(request, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            self.stats[f"{verb} {error.code().name} {reason_of(error)}"] += 1
            if error.code() not in REFUSALS:
                self.flag(f"{verb}({short(request)}) ended {error.code().name}: {error.details()!r}")
            return None
        self.stats[f"{verb} ok"] += 1
        return reply

    def handle(self) -> str:
        open_tops = [h for h in self.tops if h not in self.closed]
        roll = self.rng.random()
        if self.children and roll < 0.15:
            return self.rng.choice(self.children)
        if open_tops and roll < 0.9:
            return self.rng.choice(open_tops)
        return self.rng.choice(self.tops)

    def text(self, handle_id: str, what: str) -> str:
        return f"[h:0:{handle_id}] {what} {self.rng.randrange(1000)}"

    def answer(self, request: pb.Request) -> pb.Answer:
        return random_answer(self.rng, request)

    def plan(self) -> list[Callable[[], Awaitable[Any]]]:
        rt = RUNTIME
        ops: list[Callable[[], Awaitable[Any]]] = []

        def add(verb: str, request: Any) -> None:
            ops.append(lambda: self.call(verb, request))

        resumed: set[str] = set()
        for _ in range(self.rng.randint(2, 6)):
            roll = self.rng.random()
            open_tops = [h for h in self.tops if h not in self.closed]
            if not self.tops or (roll < 0.1 and len(open_tops) < TOPS):
                add("Spawn", pb.SpawnRequest(runtime_id=rt, parent_id="root", agent=self.rng.choice(TOP_AGENTS)))
                continue
            h = self.handle()
            if roll < 0.4:
                add("Wake", pb.WakeRequest(runtime_id=rt, handle_id=h, prompt=self.text(h, "go")))
            elif roll < 0.47:
                add("Post", pb.PostRequest(runtime_id=rt, handle_id=h, text=self.text(h, "note")))
            elif roll < 0.54:
                add("Interrupt", pb.InterruptRequest(runtime_id=rt, handle_id=h))
            elif roll < 0.6:
                how = self.rng.choice(["plain", "force", "grace"])
                request = pb.CloseRequest(runtime_id=rt, handle_id=h, force=how == "force")
                if how == "grace":
                    request.grace.CopyFrom(duration(self.rng.uniform(0.01, 0.2)))
                add("Close", request)
            elif roll < 0.85:
                live = [r for r in self.live.values() if r.id not in resumed]
                if live:
                    pending = self.rng.choice(live)
                    resumed.add(pending.id)
                    add("Resume", pb.ResumeRequest(runtime_id=rt, answer=self.answer(pending)))
            else:
                timeout = self.rng.choice([0.001, 0.05, 0.3])
                add("Wait", pb.WaitRequest(runtime_id=rt, handle_id=h, timeout=duration(timeout)))
        return ops

    async def batch(self) -> None:
        self.round += 1
        replies = await asyncio.gather(*(op() for op in self.plan()))
        for reply in replies:
            if isinstance(reply, pb.SpawnResponse):
                self.tops.append(reply.handle_id)
            elif isinstance(reply, pb.CloseResponse):
                self.closed.update(reply.closed_handle_ids)
        await self.refresh()

    async def listing(self) -> dict[str, pb.HandleView]:
        listed = await self.stub.List(pb.ListRequest(runtime_id=RUNTIME), timeout=CALL_TIMEOUT)
        return {view.handle_id: view for view in listed.handles}

    async def refresh(self) -> None:
        """Between batches: the tree, and the Requests pending now."""
        views = await self.listing()
        self.children = [h for h in views if h.count("/") > 1]
        self.closed.update(h for h, v in views.items() if v.state == S.HANDLE_STATE_CLOSED)
        self.live = {}
        for handle_id, view in views.items():
            if view.state != S.HANDLE_STATE_SUSPENDED:
                continue
            waited = await self.call("Wait", pb.WaitRequest(runtime_id=RUNTIME, handle_id=handle_id, timeout=duration(1.0)))
            if waited is not None and waited.result.status == pb.STATUS_PENDING:
                self.live[waited.result.pending.id] = waited.result.pending

    # -- at rest --------------------------------------------------------------------------------

    async def settle(self) -> dict[str, pb.HandleView]:
        deadline = time.monotonic() + SETTLE
        while True:
            views = await self.listing()
            busy = [v.handle_id for v in views.values() if v.state in IN_FLIGHT]
            if not busy:
                return views
            if time.monotonic() > deadline:
                raise AssertionError(f"seed {SEED}: {busy} still running {SETTLE} s after the last call; {self.violations}")
            await asyncio.sleep(0.02)  # polling List: no RPC says "at rest"

    async def caught_up(self, stream: Stream, last: int) -> None:
        deadline = time.monotonic() + SETTLE
        while stream.last < last:
            if stream.task is None or stream.task.done():
                self.flag(f"stream {stream.name} ended ({stream.ended}) at seq {stream.last}, before the last event {last}")
                return
            stream.moved.clear()
            try:
                await asyncio.wait_for(stream.moved.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self.flag(f"stream {stream.name} is stuck at seq {stream.last}; the runtime's last event is {last}")
                return
        if stream.last > last:
            self.flag(f"stream {stream.name} saw seq {stream.last}, past the runtime's last event {last}")

    async def history(self, last: int) -> list[pb.Event]:
        """A fresh Watch from 0, up to the last event."""
        events: list[pb.Event] = []
        if last == 0:
            return events
        call = self.stub.Watch(pb.WatchRequest(runtime_id=RUNTIME, after_seq=0), timeout=CALL_TIMEOUT)
        async for response in call:
            events.append(response.event)
            if len(events) == last:
                break
        call.cancel()
        return events

    async def check_at_rest(self) -> None:
        views = await self.settle()
        last = await self.last_event()
        for stream in self.streams:
            await self.caught_up(stream, last)
        events = await self.history(last)
        if [e.seq for e in events] != list(range(1, last + 1)):
            self.flag(f"a fresh Watch from 0 sent seqs {[e.seq for e in events][:50]}..., not 1..{last}")
            return
        union: set[int] = set()
        for stream in self.streams + self.retired:
            for seq, event in stream.seen.items():
                union.add(seq)
                if seq > last or event.SerializeToString(deterministic=True) != events[seq - 1].SerializeToString(
                    deterministic=True
                ):
                    self.flag(
                        f"stream {stream.name} saw {short(event)}; history has {short(events[seq - 1]) if seq <= last else '-'}"
                    )
        if union != set(range(1, last + 1)):
            self.flag(
                f"the streams saw {len(union)} of the {last} events: missing {sorted(set(range(1, last + 1)) - union)[:20]}"
            )
        implied = fold(self, events)
        if set(implied) != set(views):
            self.flag(f"handles spawned by the events {sorted(implied)} but listed {sorted(views)}")
        for handle_id, view in views.items():
            derived = implied.get(handle_id)
            if derived is None:
                continue
            listed = (view.state, view.turns, view.own_tokens, view.total_tokens, view.tool_calls)
            told = (derived.state, derived.turns, derived.own, derived.total, derived.tool_calls)
            if listed != told:
                self.flag(f"{handle_id}: List says (state, turns, own, total, tool calls) {listed}, its events say {told}")
        self.stats["rests"] += 1
        self.stats["events at the last rest"] = last

    async def start(self, served: Served) -> None:
        self.stub = served.stub
        self.ending = ""
        if self.round == 0:
            await self.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=RUNTIME, agents=AGENTS), timeout=CALL_TIMEOUT)
            self.open(0, 0.0)  # the first stream reads from 0, quickly, and always goes on
            while len(self.streams) < STREAMS:
                self.open()
        else:
            for stream in self.streams:
                self.follow(stream)  # each from its last seq, on the new server
        await self.refresh()

    async def stop(self, served: Served) -> None:
        """A shutdown (as at SIGTERM): every stream is told UNAVAILABLE."""
        self.ending = "UNAVAILABLE"
        self.stopped_at = time.monotonic()
        # Not 0: a stream's call is then cut at once, with what its client has not read yet
        # (grpc's CANCELLED, however quickly the server ends it).
        self.grace = self.rng.choice([0.5, 2.0])
        await served.stop(grace=self.grace)
        await self.ended()
        self.stats["restarts"] += 1

    async def ended(self) -> None:
        tasks = [s.task for s in self.streams if s.task is not None]
        _, pending = await asyncio.wait(tasks, timeout=SETTLE) if tasks else (set(), set())
        if pending:
            self.flag(f"streams {[s.name for s in self.streams if s.task in pending]} did not end ({self.ending} due)")
            for task in pending:
                task.cancel()
        for stream in self.streams:
            if stream.ended != self.ending:
                self.flag(f"stream {stream.name} ended {stream.ended!r}, not {self.ending}")


@dataclass
class Implied:
    """A handle as its events tell it."""

    parent: str
    state: int = S.HANDLE_STATE_IDLE
    turns: int = 0
    own: int = 0
    total: int = 0
    tool_calls: int = 0
    reported: tuple[int, ...] = (0, 0, 0, 0)  # the highest (turns, own, total, tool calls) an event reported


def fold(hunt: Hunt, events: list[pb.Event]) -> dict[str, Implied]:
    """The history read in order: consistent with itself, and the handles it implies."""
    handles: dict[str, Implied] = {}
    for event in events:
        h, kind = event.handle_id, event.WhichOneof("payload")
        where = f"event {event.seq} ({kind} of {h})"
        if kind == "spawned":
            if h in handles:
                hunt.flag(f"{where}: spawned twice")
            parent = event.spawned.parent_id
            if parent != "root" and parent not in handles:
                hunt.flag(f"{where}: its parent {parent} was not spawned before")
            if h.rpartition("/")[0] != parent:
                hunt.flag(f"{where}: parent {parent}")
            handles[h] = Implied(parent)
            continue
        handle = handles.get(h)
        if handle is None:
            hunt.flag(f"{where}: before its handle was spawned")
            continue
        reported: tuple[int, ...] | None = None
        if kind == "state_changed":
            handle.state = event.state_changed.state
        elif kind == "turn_started":
            if event.turn_started.turn != handle.turns + 1:
                hunt.flag(f"{where}: turn {event.turn_started.turn} after {handle.turns} turns")
        elif kind == "turn_ended":
            ended = event.turn_ended
            handle.turns += 1
            handle.own += ended.tokens
            node: str = h
            while node != "root":
                handles[node].total += ended.tokens
                node = handles[node].parent
            told = (ended.turn, ended.own_tokens, ended.total_tokens)
            if told != (handle.turns, handle.own, handle.total):
                hunt.flag(f"{where}: (turn, own, total) {told}, but its events make {(handle.turns, handle.own, handle.total)}")
            reported = (ended.turn, ended.own_tokens, ended.total_tokens, handle.reported[3])
        elif kind == "tool_call_ended":
            handle.tool_calls += 1
        elif kind == "result":
            result = event.result
            told4 = (result.turns, result.own_tokens, result.total_tokens, result.tool_calls)
            mine = (handle.turns, handle.own, handle.total, handle.tool_calls)
            if result.handle_id != h or told4 != mine:
                hunt.flag(f"{where}: result of {result.handle_id} with {told4}, but its events make {mine}")
            reported = told4
        if reported is not None:
            if any(a < b for a, b in zip(reported, handle.reported, strict=True)):
                hunt.flag(f"{where}: the figures went from {handle.reported} to {reported}")
            handle.reported = tuple(max(a, b) for a, b in zip(reported, handle.reported, strict=True))
    return handles


async def test_watch_streams_see_every_event_once_in_order_under_load(
    store_url: str, model: ScriptedModelServer, server_errors: ServerErrors
) -> None:
    settings: dict[str, Any] = {
        "store": store_url,
        "llm_style": "openai",
        "llm_base_url": model.base_url,
        "llm_api_key": "sk-watch-hunt",
        "inbox_capacity": 3,
        "watch_buffer": BUFFER,
    }
    rng = random.Random(SEED)
    hunt = Hunt(Model(model, random.Random(SEED + 1)), rng)
    while hunt.round < ROUNDS and len(hunt.violations) <= 20:
        async with serve(**settings) as served:
            await hunt.start(served)
            busy_restart = False
            for _ in range(min(EPOCH, ROUNDS - hunt.round)):
                await hunt.batch()
                await hunt.shuffle_streams()
                if hunt.rng.random() < 0.04:  # a restart with runs in flight
                    busy_restart = True
                    break
            if not busy_restart:
                await hunt.check_at_rest()
            if hunt.round >= ROUNDS:
                await hunt.check_at_rest()
                hunt.ending = "NOT_FOUND"  # a deleted runtime ends its watchers' streams with NOT_FOUND
                await hunt.call("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id=RUNTIME, force=True))
                await hunt.ended()
            else:
                await hunt.stop(served)
    hunt.violations.extend(f"server log: {record}" for record in server_errors.records)
    took = time.monotonic() - hunt.started
    print(f"watch hunt: {hunt.round} rounds, seed {SEED}, {took:.1f} s; {dict(sorted(hunt.stats.items()))}")
    assert not hunt.violations, f"seed {SEED}:\n" + "\n".join(hunt.violations[:30])
