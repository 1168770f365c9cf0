"""A worker hunt: worker tools served by several ServeTools streams at once, cut at random.

Each round makes a runtime whose OpenAI-shaped scripted agents call worker tools (one to
three calls a turn, sometimes two tool turns, a `task` delegation to a helper that calls
them too): `charge` (ON_INTERRUPTED_RETRY, the default) and `audit` (ON_INTERRUPTED_ASK).
Raw ServeTools streams and the Python client's `serve_tools` serve the queue; at each call a
worker answers, answers late (past the WorkerCall's deadline), answers an error, never
answers, cuts its stream before answering, answers and then cuts, or answers and half-closes;
meanwhile workers are cut, closed, join, all leave for a while, and the host sends Wake,
Interrupt, Close(force), Wait with short timeouts, Inspect, List and Resumes of the
`in_doubt` Requests. Every call a worker receives is logged with its idempotency key. At
rest, against the README (Tools, Worker tools; Suspension and resume; Durability):

- a call is given to a worker again only after the one that held it was cut, closed its
  side, or missed the deadline (with ASK: only after the host answered `ok` without an
  output), never to the same stream twice, to three workers at most; a call answered well
  before its deadline on a stream that stayed open is never run again, and its output is
  the result;
- every transcript has exactly one tool result per tool call: the output a worker sent for
  it (never one sent past the deadline, nor one of a call run again after it), the host's
  in-doubt answer, or the documented error text;
- no handle stays RUNNING, QUEUED or SUSPENDED; the figures of a handle no Interrupt or Close
  touched are what the model server saw (turns, tokens, tool calls); totals are own plus
  children's; no figure went down between two reads;
- no RPC ended INTERNAL, UNKNOWN or past a deadline, no stream was ended by the server
  without a status (a half-closed one ends OK), and nothing hung.

Short in CI; a long hunt locally (the seed is in every failure):
    AGENTRUNTIME_WORKER_HUNT_ROUNDS=60 AGENTRUNTIME_WORKER_HUNT_SEED=7 pytest tests/e2e/test_worker_hunt.py"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import grpc
from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.build import agent, duration, transcript
from tests.support.hunt import ServerErrors, figures, reason_of, server_errors, short, store_url
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.servers import serve
from tests.support.timeouts import for_rounds

__all__ = ["server_errors", "store_url"]  # the hunts' fixtures (tests/support/hunt.py), used here

ROUNDS = int(os.environ.get("AGENTRUNTIME_WORKER_HUNT_ROUNDS", "5"))
SEED = int(os.environ.get("AGENTRUNTIME_WORKER_HUNT_SEED", str(random.randrange(1 << 30))))
QUEUE = "q"
TIMEOUT = 1.0  # each worker tool's timeout (to be taken, then to be answered)
EARLY = 0.5  # an output sent this long before its deadline is surely read by then
READ = 0.4  # and surely read when its stream stays open this long after it was sent
LATE = 0.3  # a late output is sent this long after the deadline
CALL_TIMEOUT = 20.0  # an RPC that takes this long is stuck: a finding
SETTLE = 30.0
ROUND_LIMIT = 120.0  # a round that takes this long hangs
pytestmark = for_rounds(ROUNDS, ROUND_LIMIT)
WORKER_ATTEMPTS = 3  # the README: three workers at most
Code = grpc.StatusCode
S = pb.HandleState
BAD_CODES = {Code.INTERNAL, Code.UNKNOWN, Code.DEADLINE_EXCEEDED, Code.DATA_LOSS, Code.UNIMPLEMENTED}
ALLOWED: dict[str, set[tuple[Code, str]]] = {
    "Wake": {(Code.FAILED_PRECONDITION, r) for r in ("HANDLE_CLOSED", "HANDLE_SUSPENDED", "HANDLE_RUNNING")},
    "Interrupt": set(),
    "Close": set(),
    "Resume": {(Code.FAILED_PRECONDITION, r) for r in ("NO_SUCH_REQUEST", "ALREADY_ANSWERED")},
    "Wait": set(),
    "Inspect": set(),
    "List": set(),
}
HOST_TAG = re.compile(r"\[h:([^\]]+)\]")
CHILD_TAG = re.compile(r"\[c:([0-9a-f]+)\]")
NO_WORKER = re.compile(r"^no worker of queue 'q' took the call within 1s \((.*)\)$")
TAKEN = re.compile(
    r"^worker ([^ ,]+(?:, [^ ,]+)*) of queue 'q' took the call and "
    r"(did not answer by its deadline(?: \(worker (.+) went away with it\))?"
    r"|went away without answering), and no other worker took it within 1s: it may or may not have taken effect$"
)
INTERRUPTED = "interrupted while running: it may or may not have taken effect"
ATTEMPTS = f"{WORKER_ATTEMPTS} workers took the call and none answered: it may or may not have taken effect"
BEHAVIOURS = ["ok"] * 6 + ["error", "late", "hang", "cut", "answer_cut", "answer_close"]


def worker_tool(name: str, on_interrupted: pb.OnInterrupted.ValueType = pb.ON_INTERRUPTED_UNSPECIFIED) -> pb.ToolDef:
    tool = pb.ToolDef(
        name=name,
        description=f"the {name} tool",
        worker=pb.WorkerTool(queue=QUEUE, timeout=duration(TIMEOUT)),
        on_interrupted=on_interrupted,
    )
    tool.input_schema.update({"type": "object"})
    return tool


TOOLS = [worker_tool("charge"), worker_tool("audit", pb.ON_INTERRUPTED_ASK)]
ASKS = {"audit"}
AGENTS = [agent("lead", tools=TOOLS, team=["helper"]), agent("helper", tools=TOOLS)]


# ---- the model --------------------------------------------------------------------------------


class Model:
    """The scripts, and the books: every model call and the tool calls it made, by whose it
    was (the tag in the first user message of the run: the host's Wake or the task prompt)."""

    def __init__(self, server: ScriptedModelServer, rng: random.Random) -> None:
        self.rng = rng
        self.tokens: defaultdict[str, list[int]] = defaultdict(list)
        self.tool_calls: Counter[str] = Counter()
        for name in ("lead", "helper"):
            server.script(name, self._script(name))

    @staticmethod
    def key(messages: list[dict[str, Any]]) -> str:
        for message in messages:
            if message["role"] == "user":
                text = str(message["content"])
                if found := HOST_TAG.search(text):
                    return f"h:{found.group(1)}"
                if found := CHILD_TAG.search(text):
                    return f"c:{found.group(1)}"
        raise AssertionError(f"a model call with no tag: {messages}")

    def _script(self, name: str) -> Any:
        def script(body: dict[str, Any]) -> Reply:
            messages = body["messages"]
            key = self.key(messages)
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            tool_turns = sum(1 for m in messages[last_user + 1 :] if m["role"] == "assistant" and m.get("tool_calls"))
            tokens = self.rng.randint(1, 40)
            delay = self.rng.uniform(0.0, 0.03)
            self.tokens[key].append(tokens)
            if tool_turns == 0 or (tool_turns == 1 and self.rng.random() < 0.25):
                calls: list[tuple[str, dict[str, Any]]] = [
                    (self.rng.choice(["charge", "charge", "audit"]), {"n": self.rng.randrange(10**6)})
                    for _ in range(self.rng.randint(1, 3))
                ]
                if name == "lead" and tool_turns == 0 and self.rng.random() < 0.35:
                    calls.append(("task", {"agent": "helper", "prompt": f"[c:{self.rng.getrandbits(48):012x}] help"}))
                self.tool_calls[key] += len(calls)
                return Reply(calls=calls, tokens=tokens, delay=delay)
            results = [str(m["content"]) for m in messages[last_user + 1 :] if m["role"] == "tool"]
            return Reply(text=f"{name} done: {' | '.join(results)[:300]}", tokens=tokens, delay=delay)

        return script


# ---- the workers ------------------------------------------------------------------------------


@dataclass(eq=False)
class Stream:
    """One ServeTools connection (a raw stream, or one registration of the Python client)."""

    name: str
    worker_id: str = ""
    cut_at: float | None = None  # the host cancelled it
    closed_at: float | None = None  # the host half-closed it (every output before is read)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Reception:
    """A WorkerCall a worker received (and so ran, as far as the hunt can tell)."""

    stream: Stream
    dispatch_id: str
    key: str
    tool: str
    deadline: float
    at: float
    behaviour: str
    output: str | None = None  # what the worker tried to send
    is_error: bool = False
    sent_at: float | None = None  # when it was surely handed to the stream

    def clean(self) -> bool:
        """Answered well before the deadline, on a stream that stayed open: the output counts."""
        if self.sent_at is None or self.sent_at > self.deadline - EARLY:
            return False
        cut = self.stream.cut_at
        return cut is None or cut > self.sent_at + READ

    def late(self) -> bool:
        return self.output is not None and self.behaviour == "late"

    def where(self) -> str:
        return f"{self.stream.name} ({self.behaviour}, {self.dispatch_id})"


class RawWorker:
    """A ServeTools stream driven by hand: each call gets a behaviour from the hunt's dice."""

    def __init__(self, hunt: Hunt, name: str, limit: int, steady: bool = False) -> None:
        self.hunt, self.limit, self.steady = hunt, limit, steady
        self.stream = Stream(name)
        self.call: Any = None
        self.lock = asyncio.Lock()
        self.reader: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.outputs = 0

    async def open(self) -> bool:
        self.call = self.hunt.stub.ServeTools()
        registration = pb.WorkerRegistration(queue=QUEUE, max_concurrent_calls=self.limit)
        try:
            await self.call.write(pb.ServeToolsRequest(registration=registration))
            first = await asyncio.wait_for(self.call.read(), CALL_TIMEOUT)
        except asyncio.CancelledError:
            if self.stream.cut_at is None:
                raise
            self.stream.ended.set()  # cut by the hunt while it registered
            return False
        except (grpc.aio.AioRpcError, TimeoutError) as error:
            self.hunt.flag(f"{self.stream.name}: registration failed: {error!r}")
            self.stream.ended.set()
            return False
        if first is grpc.aio.EOF or not first.HasField("registered"):
            self.hunt.flag(f"{self.stream.name}: registration answered {first!r}")
            self.stream.ended.set()
            return False
        self.stream.worker_id = first.registered.worker_id
        self.hunt.streams[self.stream.worker_id] = self.stream
        self.reader = asyncio.ensure_future(self._read())
        return True

    @property
    def live(self) -> bool:
        ended = self.stream.ended.is_set() or self.stream.cut_at is not None or self.stream.closed_at is not None
        return bool(self.stream.worker_id) and not ended

    async def _read(self) -> None:
        code: Code | None = None
        details = ""
        try:
            while True:
                response = await self.call.read()
                if response is grpc.aio.EOF:
                    code = await self.call.code()
                    details = await self.call.details()
                    break
                if not response.HasField("call"):
                    self.hunt.flag(f"{self.stream.name}: the server sent {response!r} after the registration")
                    continue
                self.received(response.call)
        except grpc.aio.AioRpcError as error:
            code, details = error.code(), error.details() or ""
        except asyncio.CancelledError:
            if self.stream.cut_at is None:
                raise
            code = Code.CANCELLED
        finally:
            self.stream.ended.set()
        self.hunt.stats[f"stream end {code.name if code else None}"] += 1
        if self.stream.cut_at is not None:
            if code not in (Code.CANCELLED, Code.OK):
                self.hunt.flag(f"{self.stream.name} was cut and ended {code}: {details!r}")
        elif code is not Code.OK:
            self.hunt.flag(f"{self.stream.name} ended {code}: {details!r} (its host did not cut it)")
        elif self.stream.closed_at is None and not self.hunt.stopping:
            self.hunt.flag(f"{self.stream.name}: the server ended the stream OK though the host still served")

    def received(self, call: pb.WorkerCall) -> None:
        behaviour = "ok" if self.steady else self.hunt.rng.choice(BEHAVIOURS)
        reception = Reception(
            self.stream,
            call.id,
            call.call.idempotency_key,
            call.call.name,
            call.deadline.ToNanoseconds() / 1e9,
            time.time(),
            behaviour,
        )
        self.hunt.receptions.append(reception)
        task = asyncio.ensure_future(self._serve(reception, self.hunt.rng.uniform(0.0, 0.12)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, reception: Reception, work: float) -> None:
        behaviour = reception.behaviour
        if behaviour == "hang":
            return
        if behaviour == "cut":
            await asyncio.sleep(work / 2)
            self.cut()
            return
        if behaviour == "late":
            await asyncio.sleep(max(0.0, reception.deadline + LATE - time.time()))
        else:
            await asyncio.sleep(work)
        await self.send(reception, is_error=behaviour == "error")
        if behaviour == "answer_cut":
            self.cut()
        elif behaviour == "answer_close":
            await self.close()

    async def send(self, reception: Reception, is_error: bool) -> None:
        if not self.live:
            return
        self.outputs += 1
        output = f"{'err' if is_error else 'out'}-{self.stream.name}-{self.outputs}"
        reception.output, reception.is_error = output, is_error
        async with self.lock:
            if not self.live:
                return
            try:
                await self.call.write(
                    pb.ServeToolsRequest(output=pb.ToolOutput(call_id=reception.dispatch_id, output=output, is_error=is_error))
                )
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):  # cut meanwhile: maybe sent
                return
        if self.stream.cut_at is None:
            reception.sent_at = time.time()

    def cut(self) -> None:
        if self.call is not None and self.stream.cut_at is None and not self.stream.ended.is_set():
            self.stream.cut_at = time.time()
            self.call.cancel()

    async def close(self) -> None:
        if not self.live:
            return
        async with self.lock:
            if not self.live:
                return
            self.stream.closed_at = time.time()
            try:
                await self.call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                return

    async def gone(self) -> None:
        """Waits for the stream's end (after a cut or a close)."""
        try:
            await asyncio.wait_for(self.stream.ended.wait(), CALL_TIMEOUT)
        except TimeoutError:
            self.hunt.flag(f"{self.stream.name} did not end within {CALL_TIMEOUT}s of its host closing it")
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class ClientWorker:
    """The Python client's `serve_tools`: each registration is a Stream; cut by cancelling it."""

    def __init__(self, hunt: Hunt, client: Client) -> None:
        self.hunt, self.client = hunt, client
        self.task: asyncio.Task[None] | None = None
        self.stream: Stream | None = None
        self.registrations = 0
        self.started = 0
        self.outputs = 0

    @property
    def live(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self) -> None:
        self.started += 1
        self.task = asyncio.ensure_future(
            self.client.serve_tools(
                QUEUE, {"charge": self.handler, "audit": self.handler}, max_concurrent_calls=3, registered=self.registered
            )
        )

    def registered(self, worker_id: str) -> None:
        self.registrations += 1
        if self.registrations != self.started:
            self.hunt.flag(
                f"the Python client registered again ({self.registrations} times, started {self.started}): its stream dropped"
            )
        self.stream = Stream(f"client.{self.registrations}", worker_id)
        self.hunt.streams[worker_id] = self.stream

    async def handler(self, arguments: dict[str, Any], call: pb.WorkerCall) -> str:
        assert self.stream is not None
        behaviour = self.hunt.rng.choice(["ok", "ok", "ok", "error", "hang"])
        reception = Reception(
            self.stream,
            call.id,
            call.call.idempotency_key,
            call.call.name,
            call.deadline.ToNanoseconds() / 1e9,
            time.time(),
            behaviour,
        )
        self.hunt.receptions.append(reception)
        await asyncio.sleep(self.hunt.rng.uniform(0.0, 0.1))
        if behaviour == "hang":
            await asyncio.sleep(3600)
        self.outputs += 1
        text = f"client-{self.outputs}"
        reception.sent_at = time.time()  # returned: the client sends it next
        if behaviour == "error":
            reception.output, reception.is_error = f"RuntimeError: {text}", True
            raise RuntimeError(text)
        reception.output = text
        return text

    async def cut(self) -> None:
        if self.task is None:
            return
        if self.stream is not None and not self.task.done():
            self.stream.cut_at = time.time()
        self.task.cancel()
        results = await asyncio.gather(self.task, return_exceptions=True)
        if not isinstance(results[0], asyncio.CancelledError):
            self.hunt.flag(f"the Python client's serve_tools ended with {results[0]!r}")
        if self.stream is not None:
            self.stream.ended.set()
        self.task = None


# ---- the hunt ---------------------------------------------------------------------------------


@dataclass
class Hunt:
    model: Model
    rng: random.Random
    client: Client
    stub: pb_grpc.AgentRuntimeAsyncStub = field(init=False)
    round: int = 0
    runtime: str = ""
    tops: list[str] = field(default_factory=list)
    woken: set[str] = field(default_factory=set)
    cut_tops: set[str] = field(default_factory=set)  # touched by an Interrupt or a Close
    workers: list[RawWorker] = field(default_factory=list)
    client_worker: ClientWorker | None = None
    receptions: list[Reception] = field(default_factory=list)
    streams: dict[str, Stream] = field(default_factory=dict)  # by the worker id the server gave it
    host_outputs: dict[str, str] = field(default_factory=dict)  # idempotency key -> the in-doubt output given
    host_failed: dict[str, str] = field(default_factory=dict)  # key -> the reason of an `ok: false`
    reruns: Counter[str] = field(default_factory=Counter)  # key -> `ok` without an output
    in_doubt_asked: Counter[str] = field(default_factory=Counter)  # key -> in_doubt Requests answered
    resumed: set[str] = field(default_factory=set)
    high: dict[str, tuple[int, ...]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    names: int = 0
    stopping: bool = False

    def flag(self, what: str) -> None:
        self.violations.append(f"round {self.round} (seed {SEED}, runtime {self.runtime}): {what}")

    # -- calls --------------------------------------------------------------------------------

    async def call(self, verb: str, request: Any) -> Any:
        try:
            reply = await getattr(self.stub, verb)(request, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            code, reason = error.code(), reason_of(error)
            self.stats[f"{verb} {code.name} {reason}"] += 1
            if code in BAD_CODES or (code, reason) not in ALLOWED[verb]:
                self.flag(f"{verb}({short(request)}) answered {code.name} {reason}: {error.details()!r}")
            return None
        self.stats[f"{verb} ok"] += 1
        if verb in ("Wait", "Resume"):
            self.saw(reply.result)
        elif verb == "Inspect":
            self.saw(reply.handle)
        elif verb == "List":
            for view in reply.handles:
                self.saw(view)
        return reply

    def saw(self, item: pb.HandleView | pb.TaskResult) -> None:
        now = figures(item)
        earlier = self.high.get(item.handle_id, (0, 0, 0, 0))
        if any(a < b for a, b in zip(now, earlier, strict=True)):
            self.flag(f"the figures (turns, own, total, tool calls) of {item.handle_id} went from {earlier} to {now}")
        self.high[item.handle_id] = tuple(max(a, b) for a, b in zip(now, earlier, strict=True))
        if item.total_tokens < item.own_tokens:
            self.flag(f"{item.handle_id}: total < own: {item}")
        if isinstance(item, pb.TaskResult):
            if item.HasField("pending") != (item.status == pb.STATUS_PENDING):
                self.flag(f"result of {item.handle_id}: pending iff PENDING: {item}")
            if item.status == pb.STATUS_ERROR:
                self.flag(f"result of {item.handle_id}: a run failed: {item}")
            if item.status == pb.STATUS_PENDING and item.pending.kind != "in_doubt":
                self.flag(f"result of {item.handle_id}: pending on {item.pending.kind!r}; only in_doubt is possible here")

    # -- workers ------------------------------------------------------------------------------

    async def join(self, steady: bool = False) -> RawWorker:
        self.names += 1
        worker = RawWorker(self, f"w{self.names}{'s' if steady else ''}", 20 if steady else self.rng.randint(1, 4), steady)
        self.workers.append(worker)
        self.stats["joined"] += 1
        await worker.open()
        return worker

    def live_workers(self) -> list[RawWorker]:
        return [worker for worker in self.workers if worker.live and not worker.steady]

    async def leave_all(self) -> None:
        for worker in self.workers:
            if self.rng.random() < 0.5:
                await worker.close()
            else:
                worker.cut()
        await asyncio.gather(*(worker.gone() for worker in self.workers))
        if self.client_worker is not None:
            await self.client_worker.cut()

    # -- a round ------------------------------------------------------------------------------

    async def wake(self, handle_id: str) -> None:
        prompt = f"[h:{self.runtime}:{handle_id}] go {self.rng.randrange(1000)}"
        if await self.call("Wake", pb.WakeRequest(runtime_id=self.runtime, handle_id=handle_id, prompt=prompt)) is not None:
            self.woken.add(handle_id)

    async def spawn(self) -> None:
        spawned = await self.call("Spawn", pb.SpawnRequest(runtime_id=self.runtime, parent_id="root", agent="lead"))
        self.tops.append(spawned.handle_id)
        await self.wake(spawned.handle_id)

    async def resume(self, request: pb.Request) -> Any:
        """The host settles an in_doubt Request: use an output, run it again, or fail it."""
        [call] = request.calls
        key = call.idempotency_key
        how = self.rng.choice(["output", "rerun", "fail"])
        self.stats[f"in_doubt {how}"] += 1
        if how == "output":
            answer = pb.Answer(
                id=request.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output=f"host-{self.rng.getrandbits(32):08x}")]
            )
        elif how == "rerun":
            answer = pb.Answer(id=request.id, ok=True)
        else:
            answer = pb.Answer(id=request.id, ok=False, reason=f"no-{self.rng.getrandbits(32):08x}")
        self.resumed.add(request.id)
        reply = await self.call("Resume", pb.ResumeRequest(runtime_id=self.runtime, answer=answer))
        if reply is not None:
            self.in_doubt_asked[key] += 1
            if how == "output":
                self.host_outputs[key] = answer.outputs[0].output
            elif how == "rerun":
                self.reruns[key] += 1
            else:
                self.host_failed[key] = answer.reason
        return reply

    async def wait_and_settle(self, handle_id: str, timeout: float) -> None:
        reply = await self.call("Wait", pb.WaitRequest(runtime_id=self.runtime, handle_id=handle_id, timeout=duration(timeout)))
        while reply is not None and reply.result.status == pb.STATUS_PENDING:
            if reply.result.pending.id in self.resumed:  # answered, and pending on it still: stuck (settle says so)
                await asyncio.sleep(0.05)
                return
            reply = await self.resume(reply.result.pending)

    async def chaos(self) -> None:
        """One random thing: to a worker, to the workers, or a host verb (run alongside)."""
        roll = self.rng.random()
        live = self.live_workers()
        rt = self.runtime
        if roll < 0.16 and live:
            self.rng.choice(live).cut()
            self.stats["chaos cut"] += 1
        elif roll < 0.24 and live:
            await self.rng.choice(live).close()
            self.stats["chaos close"] += 1
        elif roll < 0.40:
            await self.join()
        elif roll < 0.46:
            self.stats["chaos blackout"] += 1
            for worker in live:
                worker.cut()
            if self.client_worker is not None and self.client_worker.live:
                await self.client_worker.cut()
            await asyncio.sleep(self.rng.uniform(0.1, 1.2))  # nobody serves the queue for a while
            await self.join()
        elif roll < 0.52 and self.client_worker is not None:
            if self.client_worker.live:
                await self.client_worker.cut()
            else:
                self.client_worker.start()
        elif roll < 0.58:
            top = self.rng.choice(self.tops)
            self.cut_tops.add(top)
            await self.call("Interrupt", pb.InterruptRequest(runtime_id=rt, handle_id=top))
        elif roll < 0.61:
            top = self.rng.choice(self.tops)
            self.cut_tops.add(top)
            await self.call("Close", pb.CloseRequest(runtime_id=rt, handle_id=top, force=True))
        elif roll < 0.70:
            await self.wake(self.rng.choice(self.tops))
        elif roll < 0.90:
            await self.wait_and_settle(self.rng.choice(list(self.woken) or self.tops), self.rng.choice([0.01, 0.1, 0.4]))
        elif roll < 0.95:
            await self.call("Inspect", pb.InspectRequest(runtime_id=rt, handle_id=self.rng.choice(self.tops)))
        else:
            await self.call("List", pb.ListRequest(runtime_id=rt))

    async def one_round(self) -> None:
        self.round += 1
        self.runtime = f"hunt-{self.round}"
        self.tops, self.woken, self.cut_tops, self.resumed, self.workers = [], set(), set(), set(), []
        self.high = {}
        await self.call_create()
        for _ in range(self.rng.randint(1, 3)):
            await self.join()
        if self.client_worker is not None and self.rng.random() < 0.6:
            self.client_worker.start()
        for _ in range(self.rng.randint(2, 4)):
            await self.spawn()
        running: list[Awaitable[None]] = []
        for _ in range(self.rng.randint(6, 12)):
            await asyncio.sleep(self.rng.uniform(0.0, 0.25))  # a random moment, not a synchronization
            running.append(asyncio.ensure_future(self.chaos()))
        await asyncio.gather(*running)
        await self.settle()
        self.stopping = True
        await self.leave_all()
        self.stopping = False
        await self.check_at_rest()

    async def call_create(self) -> None:
        await self.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=self.runtime, agents=AGENTS), timeout=CALL_TIMEOUT)

    async def settle(self) -> None:
        """A steady worker serves the queue; every in_doubt Request is answered; all comes to rest."""
        await self.join(steady=True)
        deadline = time.monotonic() + SETTLE
        while True:
            listed = await self.call("List", pb.ListRequest(runtime_id=self.runtime))
            if listed is None:
                return
            busy = [
                v.handle_id
                for v in listed.handles
                if v.state in (S.HANDLE_STATE_RUNNING, S.HANDLE_STATE_QUEUED, S.HANDLE_STATE_SUSPENDED)
            ]
            if not busy:
                return
            if time.monotonic() > deadline:
                self.flag(
                    f"did not come to rest within {SETTLE}s: "
                    f"{[(v.handle_id, S.Name(v.state), v.pending_kind) for v in listed.handles]}"
                )
                return
            waits = [
                self.wait_and_settle(top, 1.0) for top in self.tops if any(h == top or h.startswith(top + "/") for h in busy)
            ]
            await asyncio.gather(*waits)

    # -- at rest ------------------------------------------------------------------------------

    async def check_at_rest(self) -> None:
        listed = await self.call("List", pb.ListRequest(runtime_id=self.runtime))
        if listed is None:
            return
        views = {v.handle_id: v for v in listed.handles}
        for view in views.values():
            if view.state in (S.HANDLE_STATE_RUNNING, S.HANDLE_STATE_QUEUED, S.HANDLE_STATE_SUSPENDED):
                self.flag(f"{view.handle_id} is {S.Name(view.state)} at rest")
            children = [v for v in views.values() if v.parent_id == view.handle_id]
            if view.total_tokens != view.own_tokens + sum(c.total_tokens for c in children):
                self.flag(
                    f"{view.handle_id}: total {view.total_tokens} != own {view.own_tokens} "
                    f"+ children's {[c.total_tokens for c in children]}"
                )
        prefix = f"{self.runtime}/"
        mine = [r for r in self.receptions if r.key.startswith(prefix)]
        by_key: defaultdict[str, list[Reception]] = defaultdict(list)
        for reception in sorted(mine, key=lambda r: r.at):
            by_key[reception.key].append(reception)
        shown: set[str] = set()
        for handle_id, view in views.items():
            messages = await transcript(self.stub, self.runtime, handle_id)
            cut = any(handle_id == top or handle_id.startswith(top + "/") for top in self.cut_tops)
            calls = [call for m in messages if m.role == "assistant" for call in m.tool_calls]
            results: defaultdict[str, list[pb.Message]] = defaultdict(list)
            for message in messages:
                if message.role == "tool":
                    results[message.tool_call_id].append(message)
            ids = [call.id for call in calls]
            if len(set(ids)) != len(ids) or set(results) != set(ids) or any(len(found) != 1 for found in results.values()):
                self.flag(f"{handle_id}: tool calls {ids} and results {[(k, len(v)) for k, v in results.items()]}")
            for call in calls:
                key = f"{self.runtime}/{handle_id}/{call.id}"
                shown.add(key)
                if call.name != "task" and results.get(call.id):
                    self.judge_result(key, call.name, results[call.id][0], by_key.get(key, []), cut)
            if not cut and messages:
                tag = Model.key([{"role": m.role, "content": m.content} for m in messages])
                seen = self.model.tokens.get(tag, [])
                if (view.turns, view.own_tokens, view.tool_calls) != (len(seen), sum(seen), self.model.tool_calls[tag]):
                    self.flag(
                        f"{handle_id}: (turns, own tokens, tool calls) {(view.turns, view.own_tokens, view.tool_calls)}, "
                        f"the model answered {(len(seen), sum(seen), self.model.tool_calls[tag])}"
                    )
                if view.tool_calls != len(calls):
                    self.flag(f"{handle_id}: {view.tool_calls} tool calls counted, its transcript has {len(calls)}")
        for key, receptions in by_key.items():
            self.judge_receptions(key, receptions)
            handle_id = key[len(prefix) :].rsplit("/", 1)[0]
            cut = any(handle_id == top or handle_id.startswith(top + "/") for top in self.cut_tops)
            if key not in shown and not cut:
                self.flag(f"{key} ran at {[r.where() for r in receptions]}, and no transcript shows the call")
        self.stats["calls received"] += len(mine)
        self.stats["keys"] += len(by_key)

    def judge_receptions(self, key: str, receptions: list[Reception]) -> None:
        """Given again only after a loss, never to one stream twice, to three workers at most."""
        streams = [r.stream for r in receptions]
        if len(set(map(id, streams))) != len(streams):
            self.flag(f"{key} was given to one stream twice: {[r.where() for r in receptions]}")
        if len({r.dispatch_id for r in self.receptions if r.key == key}) != len(receptions):
            self.flag(f"{key}: two receptions with one WorkerCall id: {[r.where() for r in receptions]}")
        for earlier, later in itertools.pairwise(receptions):
            if earlier.clean():
                self.flag(
                    f"{key} was answered by {earlier.where()} {earlier.deadline - earlier.sent_at:.2f}s before its deadline "  # type: ignore[operator]
                    f"on a stream that stayed open, and was run again at {later.where()} {later.at - earlier.sent_at:.2f}s later"  # type: ignore[operator]
                )
        tool = receptions[0].tool
        if tool in ASKS:
            allowed = 1 + self.reruns[key]
            if len(receptions) > allowed:
                self.flag(f"{key} (ASK) ran {len(receptions)} times with {self.reruns[key]} reruns asked: {ran(receptions)}")
        elif len(receptions) > WORKER_ATTEMPTS:
            self.flag(f"{key} (RETRY) ran at {len(receptions)} workers: {[r.where() for r in receptions]}")

    def judge_result(self, key: str, tool: str, message: pb.Message, receptions: list[Reception], cut: bool) -> None:
        """The result is what a worker sent for the call's last run, the host's, or a documented error."""
        content, last = message.content, (receptions[-1] if receptions else None)
        sent = [r for r in receptions if r.output == content]
        if sent:
            [source] = sent
            self.stats["result from a worker"] += 1
            if last is not None and source is not last:
                self.flag(f"{key}: the result {content!r} is from {source.where()}, but the call ran again at {last.where()}")
            if source.late():
                self.flag(f"{key}: the result {content!r} was sent past the call's deadline by {source.where()}")
            if message.is_error != source.is_error:
                self.flag(f"{key}: the result {content!r} is_error {message.is_error}, the worker sent {source.is_error}")
            return
        if cut and message.is_error and (content == INTERRUPTED or content.startswith("not run: ")):
            self.stats["result interrupted"] += 1  # an Interrupt or a Close cut the call off
            return
        if last is not None and last.clean() and not cut:
            self.flag(
                f"{key}: {last.where()} answered {last.output!r} in time on a stream that stayed open, the result is {content!r}"
            )
            return
        if content == self.host_outputs.get(key):
            self.stats["result from the host"] += 1
            return
        if key in self.host_failed and content == f"failed by the host (it was in doubt): {self.host_failed[key]}":
            self.stats["result failed by the host"] += 1
            return
        if not message.is_error:
            self.flag(f"{key}: the result {content!r} is no worker's output, nor the host's: {[r.where() for r in receptions]}")
            return
        if NO_WORKER.match(content):
            self.stats["result no worker"] += 1
            if receptions and self.in_doubt_asked[key] == 0:
                # Taken by none, says the result; but a worker took it and may have run it.
                self.flag(f"{key}: the result says {content!r}, but {', '.join(r.where() for r in receptions)} took the call")
            return
        if found := TAKEN.match(content):
            self.stats["result taken and lost"] += 1
            named = [*found.group(1).split(", "), *(found.group(3) or "").split(", ")]  # (each worker that took it)
            for worker_id in filter(None, named):
                stream = self.streams.get(worker_id)
                took = any(r.stream is stream for r in receptions)
                # A stream cut or closed may have been sent the call without its host reading it.
                if stream is None or not (took or stream.cut_at is not None or stream.closed_at is not None):
                    self.flag(f"{key}: the result says {content!r}, but {worker_id} never had the call: {ran(receptions)}")
            if found.group(2).startswith("did not answer") and not any(r.behaviour in ("late", "hang") for r in receptions):
                self.flag(f"{key}: the result says {content!r}, but no worker kept the call: {[r.where() for r in receptions]}")
            if any(r.clean() for r in receptions) and not cut:
                self.flag(
                    f"{key}: the result says {content!r}, but a worker answered it in time: {[r.where() for r in receptions]}"
                )
            return
        if content == ATTEMPTS:
            self.stats["result three lost"] += 1
            # (A stream cut as the server sent it the call counts as a worker that took it.)
            if tool in ASKS or len(receptions) > WORKER_ATTEMPTS or any(r.clean() for r in receptions):
                self.flag(f"{key}: the result says {content!r}, it ran at {[r.where() for r in receptions]}")
            return
        self.flag(f"{key}: the error result {content!r} is none of the documented ones: {[r.where() for r in receptions]}")


async def watched(round_: Awaitable[None], hunt: Hunt) -> bool:
    """A round that does not end within ROUND_LIMIT hangs somewhere: say where, and stop."""
    task = asyncio.ensure_future(round_)
    done, _ = await asyncio.wait([task], timeout=ROUND_LIMIT)
    if task in done:
        task.result()
        return True
    stacks = []
    for other in asyncio.all_tasks():
        if other is asyncio.current_task():
            continue
        frames = other.get_stack(limit=8)
        stacks.append(f"{other.get_name()}: " + " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in frames))
    hunt.flag(f"the round did not end within {ROUND_LIMIT}s; tasks:\n      " + "\n      ".join(stacks))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False


def ran(receptions: list[Reception]) -> list[str]:
    return [r.where() for r in receptions]


async def test_worker_tools_under_cuts_and_host_verbs_keep_the_documented_guarantees(
    store_url: str, model: ScriptedModelServer, server_errors: ServerErrors
) -> None:
    settings: dict[str, Any] = {
        "store": store_url,
        "llm_style": "openai",
        "llm_base_url": model.base_url,
        "llm_api_key": "sk-worker-hunt",
    }
    rng = random.Random(SEED)
    started = time.monotonic()
    async with serve(**settings) as served:
        async with Client(f"127.0.0.1:{served.port}") as client:
            hunt = Hunt(Model(model, random.Random(SEED + 1)), rng, client)
            hunt.stub = served.stub
            hunt.client_worker = ClientWorker(hunt, client)
            while hunt.round < ROUNDS and len(hunt.violations) <= 20:
                if not await watched(hunt.one_round(), hunt):
                    break
        for line in hunt.violations[:30]:
            print(line)  # now, in case the stop below hangs
        stopping = asyncio.ensure_future(served.stop())
        done, _ = await asyncio.wait([stopping], timeout=CALL_TIMEOUT)
        if not done:
            hunt.flag(f"the server did not stop within {CALL_TIMEOUT}s")
    hunt.violations.extend(f"server log: {record}" for record in server_errors.records)
    print(f"worker hunt: {hunt.round} rounds, seed {SEED}, {time.monotonic() - started:.1f}s; {dict(sorted(hunt.stats.items()))}")
    assert not hunt.violations, "\n".join(hunt.violations[:30])
