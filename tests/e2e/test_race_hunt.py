"""A race hunt: random batches of verbs sent at the same moment to one runtime.

tests/e2e/test_stateful.py sends one verb at a time; here each round fires a seeded random batch
(asyncio.gather) of Spawn, Wake, Post, Interrupt, Close (plain, force, grace), Resume (the
right answer, a wrong id, the same answer twice, two different answers), Wait with short
timeouts, Inspect, List and, rarely, DeleteRuntime (then CreateRuntime again) at a few
handles of one runtime on a real server (SQLite file store) whose OpenAI-shaped model
answers after small random delays. After every batch: no call got a code a caller's
mistake cannot get (INTERNAL, UNKNOWN, a deadline), every refusal has a documented code,
reason and message, and no figure of any handle went down since the batch before. Two
different answers to one Request: one wins, the other is ALREADY_ANSWERED, and no model
ever sees the loser's output. Every few rounds the runtime is left to settle: nothing stays
RUNNING, every parent's total is its own plus its children's totals, every handle's turns
(and tokens) are the model calls the model server saw for it (more only by the calls an
Interrupt or a Close cut), and a restart on the same store shows the same handles and
figures.

Short in CI; a long hunt locally (each round prints nothing, the seed is in the failure):
    AGENTRUNTIME_RACE_ROUNDS=400 AGENTRUNTIME_RACE_SEED=7 pytest tests/e2e/test_race_hunt.py"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import duration, struct
from tests.support.hunt import (
    AGENTS,
    OUTPUT,
    TOP_AGENTS,
    Model,
    ServerErrors,
    figures,
    random_answer,
    reason_of,
    server_errors,
    short,
    store_url,
    top_of,
)
from tests.support.model_server import ScriptedModelServer
from tests.support.servers import serve
from tests.support.timeouts import for_rounds

__all__ = ["server_errors", "store_url"]  # the hunts' fixtures (tests/support/hunt.py), used here

ROUNDS = int(os.environ.get("AGENTRUNTIME_RACE_ROUNDS", "45"))
SEED = int(os.environ.get("AGENTRUNTIME_RACE_SEED", str(random.randrange(1 << 30))))
EPOCH = int(os.environ.get("AGENTRUNTIME_RACE_EPOCH", "15"))  # rounds between two settles (and restarts)
# Rounds take a few hundredths of a second here: 2 s each before the hunt is called hung.
pytestmark = for_rounds(ROUNDS, 2.0)
RUNTIME = "race"
TOPS = 4  # open top-level handles at most
CALL_TIMEOUT = 20.0  # a call that takes this long is stuck: a finding, not a slow machine
SETTLE = 20.0  # seconds the runtime gets to come to rest (every script ends in well under one)
Code = grpc.StatusCode
S = pb.HandleState
IN_FLIGHT = {S.HANDLE_STATE_RUNNING, S.HANDLE_STATE_QUEUED}
DOCUMENTED = {Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.RESOURCE_EXHAUSTED}
REASONS = {"HANDLE_CLOSED", "HANDLE_SUSPENDED", "HANDLE_RUNNING", "NEVER_RUN", "NO_SUCH_REQUEST", "ALREADY_ANSWERED"}
# What each verb may be refused with when every id it names exists (NOT_FOUND only beside a delete).
ALLOWED: dict[str, set[tuple[Code, str]]] = {
    "Spawn": set(),
    "Wake": {(Code.FAILED_PRECONDITION, r) for r in ("HANDLE_CLOSED", "HANDLE_SUSPENDED", "HANDLE_RUNNING")},
    "Post": {(Code.FAILED_PRECONDITION, "HANDLE_CLOSED"), (Code.RESOURCE_EXHAUSTED, "INBOX_FULL")},
    "Interrupt": set(),
    "Close": {(Code.FAILED_PRECONDITION, "HANDLE_RUNNING")},
    "Resume": {(Code.FAILED_PRECONDITION, r) for r in ("NO_SUCH_REQUEST", "ALREADY_ANSWERED")},
    "Wait": {(Code.FAILED_PRECONDITION, "NEVER_RUN")},
    "Inspect": set(),
    "List": set(),
    "DeleteRuntime": {(Code.FAILED_PRECONDITION, "HANDLE_RUNNING")},
}
CUTTING = {"Interrupt", "Close", "DeleteRuntime"}  # verbs that may cut a model call in flight


# ---- the model --------------------------------------------------------------------------------


# ---- the hunt ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    verb: str
    target: str  # the handle (or `root`, or the Request id) it named
    request: Any
    reply: Any = None
    code: Code | None = None
    reason: str = ""
    message: str = ""


@dataclass
class Race:
    """Two Resumes of one Request in one batch."""

    request_id: str
    same: bool
    first: Outcome
    second: Outcome


@dataclass
class Hunt:
    model: Model
    rng: random.Random
    stub: pb_grpc.AgentRuntimeAsyncStub = field(init=False)
    gen: int = 0
    tops: list[str] = field(default_factory=list)  # top-level handles of this generation
    closed: set[str] = field(default_factory=set)
    views: dict[str, pb.HandleView] = field(default_factory=dict)  # the last List
    live: dict[str, pb.Request] = field(default_factory=dict)  # Requests pending at the batch's start
    answered: list[pb.Answer] = field(default_factory=list)
    high: dict[tuple[int, str], tuple[int, ...]] = field(default_factory=dict)
    cuts: Counter[str] = field(default_factory=Counter)  # top key -> verbs that may have cut a call in it
    lost_outputs: set[str] = field(default_factory=set)  # outputs of Resumes that were refused
    won_outputs: set[str] = field(default_factory=set)  # and of those that were taken
    deleted_at: dict[int, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    round: int = 0

    trail: list[str] = field(default_factory=list)  # the calls of the current round, for a report

    def flag(self, what: str) -> None:
        self.violations.append(f"round {self.round} (seed {SEED}): {what}\n    in a batch of: " + "; ".join(self.trail))

    # -- calling ----------------------------------------------------------------------------

    async def call(self, verb: str, target: str, request: Any) -> Outcome:
        outcome = Outcome(verb, target, request)
        try:
            outcome.reply = await getattr(self.stub, verb)(request, timeout=CALL_TIMEOUT)
            self.stats[f"{verb} ok"] += 1
        except grpc.aio.AioRpcError as error:
            outcome.code, outcome.message = error.code(), error.details() or ""
            outcome.reason = reason_of(error)
            self.stats[f"{verb} {outcome.code.name} {outcome.reason}"] += 1
        return outcome

    def judge(self, outcome: Outcome, deleting: bool) -> None:
        """A refusal a caller can act on: a documented code, reason and message."""
        if outcome.code is None:
            return
        where = f"{outcome.verb}({outcome.target})"
        if outcome.code not in DOCUMENTED:
            self.flag(f"{where} answered {outcome.code.name}: {outcome.message!r}")
            return
        if not outcome.message or len(outcome.message) > 600 or "Traceback" in outcome.message:
            self.flag(f"{where}: {outcome.code.name} with message {outcome.message!r}")
        if outcome.code is Code.FAILED_PRECONDITION and outcome.reason not in REASONS:
            self.flag(f"{where}: FAILED_PRECONDITION with undocumented reason {outcome.reason!r}: {outcome.message}")
        if outcome.code is Code.NOT_FOUND and deleting:
            return
        wrong_on_purpose = outcome.verb == "Resume" and outcome.request.answer.id.startswith("nope")
        if (outcome.code, outcome.reason) not in ALLOWED[outcome.verb] and not wrong_on_purpose:
            self.flag(f"{where} refused with {outcome.code.name} {outcome.reason}: {outcome.message}")

    def saw(self, handle_id: str, item: pb.HandleView | pb.TaskResult, before: dict[tuple[int, str], tuple[int, ...]]) -> None:
        """No figure decreases: every read of a batch is at least every read of the batches before."""
        key = (self.gen, handle_id)
        now = figures(item)
        earlier = before.get(key, (0, 0, 0, 0))
        if any(a < b for a, b in zip(now, earlier, strict=True)):
            self.flag(f"the figures (turns, own, total, tool calls) of {handle_id} went from {earlier} to {now}")
        self.high[key] = tuple(max(a, b) for a, b in zip(now, self.high.get(key, now), strict=True))
        if isinstance(item, pb.TaskResult):
            check_result(self, item)

    # -- one round ----------------------------------------------------------------------------

    def handle(self) -> str:
        """Mostly an open top-level handle; sometimes a closed one or a delegated child."""
        open_tops = [h for h in self.tops if h not in self.closed]
        children = [h for h in self.views if h.count("/") > 1]
        roll = self.rng.random()
        if children and roll < 0.15:
            return self.rng.choice(children)
        if open_tops and roll < 0.9:
            return self.rng.choice(open_tops)
        return self.rng.choice(self.tops)

    def text(self, handle_id: str, what: str) -> str:
        # A child's messages keep its task prompt's tag first; the host's tag names it as well.
        return f"[h:{self.gen}:{handle_id}] {what} {self.rng.randrange(1000)}"

    def answer(self, request: pb.Request) -> pb.Answer:
        return random_answer(self.rng, request)

    def plan(self) -> tuple[list[Callable[[], Awaitable[Outcome]]], list[tuple[str, bool, int, int]]]:
        """A batch of calls to start at once; the Resume races among them (request, same, i, j)."""
        rt = RUNTIME
        ops: list[Callable[[], Awaitable[Outcome]]] = []
        races: list[tuple[str, bool, int, int]] = []
        resumed: set[str] = set()

        def add(verb: str, target: str, request: Any) -> int:
            ops.append(lambda: self.call(verb, target, request))
            return len(ops) - 1

        for _ in range(self.rng.randint(2, 7)):
            roll = self.rng.random()
            open_tops = [h for h in self.tops if h not in self.closed]
            if not self.tops or (roll < 0.08 and len(open_tops) < TOPS):
                add("Spawn", "root", pb.SpawnRequest(runtime_id=rt, parent_id="root", agent=self.rng.choice(TOP_AGENTS)))
                continue
            h = self.handle()
            if roll < 0.30:
                prompt = self.text(h, "go")
                add("Wake", h, pb.WakeRequest(runtime_id=rt, handle_id=h, prompt=prompt))
            elif roll < 0.38:
                add("Post", h, pb.PostRequest(runtime_id=rt, handle_id=h, text=self.text(h, "note")))
            elif roll < 0.44:
                add("Interrupt", h, pb.InterruptRequest(runtime_id=rt, handle_id=h))
            elif roll < 0.50:
                target = "root" if self.rng.random() < 0.1 else h
                how = self.rng.choice(["plain", "force", "grace"])
                request = pb.CloseRequest(runtime_id=rt, handle_id=target, force=how == "force")
                if how == "grace":
                    request.grace.CopyFrom(duration(self.rng.uniform(0.01, 0.2)))
                add("Close", target, request)
            elif roll < 0.75:
                live = [r for r in self.live.values() if r.id not in resumed]
                how = self.rng.choice(["right", "same", "different", "different", "wrong", "stale"])
                if how == "wrong" or (not live and how != "stale"):
                    answer = pb.Answer(id=f"nope-{self.rng.randrange(1000)}", ok=True)
                    add("Resume", answer.id, pb.ResumeRequest(runtime_id=rt, answer=answer))
                elif how == "stale":
                    if self.answered:
                        old = self.rng.choice(self.answered)
                        answer = pb.Answer()
                        answer.CopyFrom(old)
                        if self.rng.random() < 0.5:  # a different answer to a Request answered before
                            answer.CopyFrom(self.answer_like(old))
                        add("Resume", answer.id, pb.ResumeRequest(runtime_id=rt, answer=answer))
                else:
                    pending = self.rng.choice(live)
                    resumed.add(pending.id)
                    first = self.answer(pending)
                    i = add("Resume", pending.id, pb.ResumeRequest(runtime_id=rt, answer=first))
                    if how != "right":
                        second = first if how == "same" else self.answer(pending)
                        j = add("Resume", pending.id, pb.ResumeRequest(runtime_id=rt, answer=second))
                        races.append((pending.id, how == "same", i, j))
            elif roll < 0.88:
                timeout = self.rng.choice([0.001, 0.02, 0.1, 0.3])
                add("Wait", h, pb.WaitRequest(runtime_id=rt, handle_id=h, timeout=duration(timeout)))
            elif roll < 0.94:
                add("Inspect", h, pb.InspectRequest(runtime_id=rt, handle_id=h))
            elif roll < 0.995:
                add("List", "root", pb.ListRequest(runtime_id=rt))
            else:
                add("DeleteRuntime", rt, pb.DeleteRuntimeRequest(runtime_id=rt, force=self.rng.random() < 0.7))
        return ops, races

    def answer_like(self, old: pb.Answer) -> pb.Answer:
        answer = pb.Answer()
        answer.CopyFrom(old)
        output = f"out-{self.rng.getrandbits(48):012x}"
        for item in answer.outputs:
            item.output = output
        if answer.HasField("data"):
            answer.data.CopyFrom(struct({"answer": output}))
        return answer

    async def batch(self) -> None:
        self.round += 1
        ops, races = self.plan()
        before = dict(self.high)
        outcomes = list(await asyncio.gather(*(op() for op in ops)))
        self.trail = [
            f"{o.verb}({o.target}{' ' + short(o.request) if o.verb in ('Close', 'Resume', 'Wait', 'DeleteRuntime') else ''})"
            f" -> {o.code.name + ' ' + o.reason if o.code else 'OK'}"
            for o in outcomes
        ]
        deleting = any(o.verb == "DeleteRuntime" for o in outcomes)
        for outcome in outcomes:
            self.judge(outcome, deleting)
            self.book(outcome, before, deleting)
        for request_id, same, i, j in races:
            self.race(Race(request_id, same, outcomes[i], outcomes[j]), outcomes, deleting)
        if any(o.verb == "DeleteRuntime" and o.code is None for o in outcomes):
            await self.recreate()
        await self.refresh(before)

    def book(self, outcome: Outcome, before: dict[tuple[int, str], tuple[int, ...]], deleting: bool) -> None:
        reply, verb = outcome.reply, outcome.verb
        if verb in CUTTING and (verb != "Close" or outcome.request.force or outcome.request.HasField("grace")):
            if verb == "Interrupt" or (verb == "Close" and outcome.target != "root"):
                self.cuts[f"h:{self.gen}:{top_of(outcome.target)}"] += 1
            else:
                for top in self.tops:
                    self.cuts[f"h:{self.gen}:{top}"] += 1
        if verb == "Resume" and not deleting:  # (a Resume a delete cut may have been taken, then lost)
            outputs = OUTPUT.findall(str(outcome.request.answer))
            (self.lost_outputs if reply is None else self.won_outputs).update(outputs)
        if reply is None:
            return
        if verb == "Spawn":
            self.tops.append(reply.handle_id)
        elif verb == "Close":
            self.closed.update(reply.closed_handle_ids)
        elif verb in ("Wait", "Resume"):
            self.saw(reply.result.handle_id, reply.result, before)
            if verb == "Resume":
                self.answered.append(outcome.request.answer)
        elif verb == "Inspect":
            self.saw(reply.handle.handle_id, reply.handle, before)
        elif verb == "List":
            for view in reply.handles:
                self.saw(view.handle_id, view, before)

    def race(self, race: Race, outcomes: list[Outcome], deleting: bool) -> None:
        a, b = race.first, race.second
        won = [o for o in (a, b) if o.code is None]
        # Interfering: a verb in the same batch that may withdraw the Request first.
        subtree = top_of(race.request_id.split(":")[0])
        interfered = deleting or any(
            o.verb in ("Interrupt", "Close") and (o.target == "root" or top_of(o.target) == subtree) for o in outcomes
        )
        if race.same:
            self.stats["race same"] += 1
            if len(won) == 2 and (a.reply.result.handle_id, a.reply.result.status, a.reply.result.text) != (
                b.reply.result.handle_id,
                b.reply.result.status,
                b.reply.result.text,
            ):
                self.flag(f"the same answer to {race.request_id} twice at once: {a.reply.result} and {b.reply.result}")
            if not interfered and len(won) != 2:
                self.flag(f"the same answer to {race.request_id} twice at once: {[(o.code, o.message) for o in (a, b)]}")
            return
        self.stats["race different"] += 1
        if len(won) == 2:
            self.flag(f"two different answers to {race.request_id} both won")
        if interfered:
            return
        lost = [o for o in (a, b) if o.code is not None]
        if len(won) != 1 or lost[0].reason != "ALREADY_ANSWERED":
            self.flag(
                f"two different answers to {race.request_id}: expected one winner and ALREADY_ANSWERED, got "
                f"{[(o.code, o.reason, o.message) for o in (a, b)]}"
            )

    async def recreate(self) -> None:
        self.deleted_at[self.gen] = time.monotonic()
        self.gen += 1
        self.tops, self.closed, self.views, self.live = [], set(), {}, {}
        self.answered = []
        self.stats["deleted"] += 1
        try:
            await self.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=RUNTIME, agents=AGENTS), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            self.flag(f"CreateRuntime after DeleteRuntime: {error.code().name} {error.details()}")

    async def listing(self) -> dict[str, pb.HandleView]:
        listed = await self.stub.List(pb.ListRequest(runtime_id=RUNTIME), timeout=CALL_TIMEOUT)
        return {view.handle_id: view for view in listed.handles}

    async def refresh(self, before: dict[tuple[int, str], tuple[int, ...]]) -> None:
        """Between batches (not part of the race): the tree, and the Requests pending now."""
        self.views = await self.listing()
        for view in self.views.values():
            self.saw(view.handle_id, view, before)
            if view.handle_id in self.closed and view.state != S.HANDLE_STATE_CLOSED:
                self.flag(f"{view.handle_id} was closed, and is {S.Name(view.state)} now")
            if view.state == S.HANDLE_STATE_CLOSED:
                self.closed.add(view.handle_id)
        self.live = {}
        for handle_id, view in self.views.items():
            if view.state != S.HANDLE_STATE_SUSPENDED:
                continue
            wait = pb.WaitRequest(runtime_id=RUNTIME, handle_id=handle_id, timeout=duration(1.0))
            waited = await self.call("Wait", handle_id, wait)
            if waited.reply is not None and waited.reply.result.status == pb.STATUS_PENDING:
                self.live[waited.reply.result.pending.id] = waited.reply.result.pending

    # -- at rest --------------------------------------------------------------------------------

    async def settle(self) -> dict[str, pb.HandleView]:
        """Nothing may stay RUNNING: every script ends within a fraction of a second."""
        deadline = time.monotonic() + SETTLE
        forced = False
        while True:
            views = await self.listing()
            busy = [v.handle_id for v in views.values() if v.state in IN_FLIGHT]
            if not busy:
                return views
            if time.monotonic() > deadline + (SETTLE if forced else 0):
                if forced:
                    raise AssertionError(f"{busy} run on after a forced Close of the runtime; {self.violations}")
                forced = True
                self.flag(f"still running {SETTLE} s after the last call: {busy}")
                await self.stub.Close(pb.CloseRequest(runtime_id=RUNTIME, handle_id="root", force=True), timeout=CALL_TIMEOUT)
                self.closed.update(views)
            await asyncio.sleep(0.02)

    def check_at_rest(self, views: dict[str, pb.HandleView]) -> None:
        children: dict[str, list[pb.HandleView]] = defaultdict(list)
        for view in views.values():
            children[view.parent_id].append(view)
        for view in views.values():
            below = sum(child.total_tokens for child in children[view.handle_id])
            if view.total_tokens != view.own_tokens + below:
                self.flag(f"{view.handle_id}: total {view.total_tokens} != own {view.own_tokens} + children {below}")
            if (view.state == S.HANDLE_STATE_SUSPENDED) != bool(view.pending_kind):
                self.flag(f"pending_kind iff SUSPENDED: {view}")
        # The model's books against the handles' figures, subtree by subtree.
        own_calls: dict[str, list[int]] = defaultdict(list)
        child_calls: dict[str, list[int]] = defaultdict(list)
        for seen in self.model.seen:
            top = self.model.top(seen.key)
            if not top.startswith(f"h:{self.gen}:"):
                continue
            (own_calls if seen.key == top else child_calls)[top].append(seen.tokens)
        for top_id in {top_of(h) for h in views}:
            key = f"h:{self.gen}:{top_id}"
            top_view = views[top_id]
            descendants = [v for v in views.values() if v.handle_id.startswith(top_id + "/")]
            cuts = self.cuts[key]
            # Host-woken children are not part of this hunt: every child here runs on its task prompt.
            for label, handles, calls in (
                ("its own", [top_view], own_calls[key]),
                ("its children's", descendants, child_calls[key]),
            ):
                turns = sum(v.turns for v in handles)
                tokens = sum(v.own_tokens for v in handles)
                slack = cuts * max(1, len(handles))
                if not turns <= len(calls) <= turns + slack:
                    self.flag(
                        f"{top_id}: {label} turns {turns}, but the model answered {len(calls)} calls "
                        f"({cuts} Interrupts/Closes could cut one each)"
                    )
                elif cuts == 0 and tokens != sum(calls):
                    self.flag(f"{top_id}: {label} tokens {tokens}, but the model answered {sum(calls)} tokens")
        shown = self.model.outputs_seen & (self.lost_outputs - self.won_outputs)
        if shown:
            self.flag(f"a model was shown the output of a Resume that was refused: {sorted(shown)}")
        for gen, at in self.deleted_at.items():
            late = [s.key for s in self.model.seen if s.at > at + 1.0 and self.model.top(s.key).startswith(f"h:{gen}:")]
            if late:
                self.flag(f"runtime generation {gen} was deleted, and its handles called the model after: {late[:3]}")

    async def start(self, stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
        self.stub = stub
        if self.round == 0:
            await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=RUNTIME, agents=AGENTS), timeout=CALL_TIMEOUT)


def check_result(hunt: Hunt, result: pb.TaskResult) -> None:
    where = f"result of {result.handle_id}"
    if result.total_tokens < result.own_tokens:
        hunt.flag(f"{where}: total < own: {result}")
    if (result.limit != pb.LIMIT_UNSPECIFIED) != (result.status == pb.STATUS_INCOMPLETE):
        hunt.flag(f"{where}: limit iff INCOMPLETE: {result}")
    if result.HasField("pending") != (result.status == pb.STATUS_PENDING):
        hunt.flag(f"{where}: pending iff PENDING: {result}")
    if result.HasField("failure") != (result.status == pb.STATUS_ERROR) or result.status == pb.STATUS_ERROR:
        hunt.flag(f"{where}: a run failed: {result}")


async def test_verbs_sent_at_once_keep_the_documented_invariants(
    store_url: str, model: ScriptedModelServer, server_errors: ServerErrors
) -> None:
    settings: dict[str, Any] = {
        "store": store_url,
        "llm_style": "openai",
        "llm_base_url": model.base_url,
        "llm_api_key": "sk-race-hunt",
        "inbox_capacity": 3,
    }
    rng = random.Random(SEED)
    hunt = Hunt(Model(model, random.Random(SEED + 1)), rng)
    snapshot: dict[str, pb.HandleView] | None = None
    while hunt.round < ROUNDS:
        async with serve(**settings) as served:
            await hunt.start(served.stub)
            if snapshot is not None:
                calls = len(hunt.model.seen)
                again = await hunt.listing()
                if {h: (v.state, figures(v), v.pending_kind, v.last_status, v.inbox_size) for h, v in again.items()} != {
                    h: (v.state, figures(v), v.pending_kind, v.last_status, v.inbox_size) for h, v in snapshot.items()
                }:
                    hunt.flag(f"a restart changed the tree: {list(snapshot.values())} then {list(again.values())}")
                if len(hunt.model.seen) != calls:
                    hunt.flag("a restart of a runtime at rest called the model")
                await hunt.refresh(dict(hunt.high))
            for _ in range(min(EPOCH, ROUNDS - hunt.round)):
                await hunt.batch()
                if len(hunt.violations) > 20:
                    break
            snapshot = await hunt.settle()
            hunt.check_at_rest(snapshot)
            await hunt.refresh(dict(hunt.high))
        if len(hunt.violations) > 20:
            break
    hunt.violations.extend(f"server log: {record}" for record in server_errors.records)
    print(f"race hunt: {hunt.round} rounds, seed {SEED}; {dict(sorted(hunt.stats.items()))}")
    assert not hunt.violations, "\n".join(hunt.violations[:30])
