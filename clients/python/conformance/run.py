"""The Python conformance runner: every vector in tests/vectors against AGENTRUNTIME_ADDR."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentruntime.client import AgentRuntimeError, Client
from agentruntime.output import OutputError, output_as, output_json
from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import duration_pb2, json_format, struct_pb2, text_format
from google.protobuf.message import Message
from google.rpc import error_details_pb2

DEFAULT_VECTORS = Path(__file__).resolve().parents[3] / "tests" / "vectors"

# The README's deadline for every call, Wait included.
CALL_TIMEOUT = 60.0
# An inspect step with "poll": re-read every POLL_EVERY seconds, for at most POLL_FOR.
POLL_EVERY = 0.05
POLL_FOR = 10.0

VERBS = (
    "spawn",
    "wake",
    "wait",
    "resume",
    "list",
    "transcript",
    "post",
    "close",
    "inspect",
    "list_runtimes",
    "delete_runtime",
    "create_runtime",
    "watch",
    "interrupt",
    "stream_run",
    "fork",
    "replay",
)
# The verbs whose step may carry "request_id" and "repeat" (README: Request ids and repeats).
MUTATING = ("spawn", "post", "wake", "resume", "interrupt", "close", "create_runtime", "delete_runtime")
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{0,40}")
WAIT_OPTIONS = ("handle", "client_timeout_ms", "restart_server_after_ms")


class Mismatch(Exception):
    pass


@dataclass
class Verdict:
    """The type a `decoded` expectation decodes a result's output into (README: wait)."""

    label: str
    confidence: float
    tags: list[str]


class _Judged:
    """An outcome field checked by a judge of its own, not by _check's rules: the judge gets
    the place and the expected value and raises Mismatch."""

    def __init__(self, judge: Callable[[str, Any], None]) -> None:
        self.judge = judge


def _json_equal(got: Any, want: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0; a boolean is no number), objects by their
    whole key set, arrays entry by entry."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, int | float) and isinstance(got, int | float):
        return got == want
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_json_equal(got[key], want[key]) for key in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_json_equal(g, w) for g, w in zip(got, want, strict=True))
    return type(got) is type(want) and got == want


def _output_judge(result: pb.TaskResult) -> _Judged:
    """`output`: the result's output as JSON; `null`: none (unset)."""

    def judge(where: str, want: Any) -> None:
        if want is None:
            if result.HasField("output"):
                raise Mismatch(f"{where}: expected no output, got {output_json(result)!r}")
        elif not result.HasField("output"):
            raise Mismatch(f"{where}: expected {want!r}, got no output")
        elif not _json_equal(output_json(result), want):
            raise Mismatch(f"{where}: expected {want!r}, got {output_json(result)!r}")

    return _Judged(judge)


def _decoded_judge(result: pb.TaskResult) -> _Judged:
    """`decoded`: the output through the client's output_as into a Verdict, field by field."""

    def judge(where: str, want: Any) -> None:
        if not isinstance(want, dict):
            raise Mismatch(f"{where}: expected an object with label, confidence and tags, got {want!r}")
        try:
            decoded = output_as(result, Verdict)
        except OutputError as error:
            raise Mismatch(f"{where}: output_as failed (path {error.path}): {error}") from None
        got = asdict(decoded)
        if not _json_equal(got, want):
            raise Mismatch(f"{where}: expected {want!r}, decoded {decoded!r}")

    return _Judged(judge)


def _result_fields(result: pb.TaskResult) -> dict[str, Any]:
    return {
        "handle_id": result.handle_id,
        "text": result.text,
        "is_error": result.is_error,
        "status": pb.Status.Name(result.status),
        "limit": pb.Limit.Name(result.limit),
        "turns": result.turns,
        "total_tokens": result.total_tokens,
        "own_tokens": result.own_tokens,
        "tool_calls": result.tool_calls,
        **_bill_fields(result),
        "pending": {
            "kind": result.pending.kind,
            "path": list(result.pending.path),
            "call_names": [call.name for call in result.pending.calls],
        },
        "failure": _failure_fields(result.failure) if result.HasField("failure") else None,
        "output": _output_judge(result),
        "decoded": _decoded_judge(result),
    }


def _failure_fields(failure: pb.Failure) -> dict[str, Any]:
    return {
        "reason": pb.FailureReason.Name(failure.reason),
        "provider": failure.provider,
        "http_status": failure.http_status,
        "retryable": failure.retryable,
        "detail": failure.detail,
    }


def _bill_fields(carrier: pb.TaskResult | pb.HandleView) -> dict[str, Any]:
    """A TaskResult's or HandleView's usage and cost (an unset message reads as its zeros)."""
    return {
        "own_usage": _usage_fields(carrier.own_usage),
        "total_usage": _usage_fields(carrier.total_usage),
        "own_cost": _cost_fields(carrier.own_cost),
        "total_cost": _cost_fields(carrier.total_cost),
        "inherited_usage": _usage_fields(carrier.inherited_usage),
        "inherited_cost": _cost_fields(carrier.inherited_cost),
    }


def _usage_fields(usage: pb.Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.output_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "total_tokens": usage.total_tokens,
        "estimated": usage.estimated,
    }


def _cost_fields(cost: pb.Cost) -> dict[str, Any]:
    return {"micros": cost.micros, "currency": cost.currency, "priced": cost.priced}


def _view_fields(view: pb.HandleView) -> dict[str, Any]:
    return {
        "state": pb.HandleState.Name(view.state),
        "turns": view.turns,
        "own_tokens": view.own_tokens,
        "total_tokens": view.total_tokens,
        "tool_calls": view.tool_calls,
        **_bill_fields(view),
        "pending_kind": view.pending_kind,
        "inbox_size": view.inbox_size,
    }


def _message_fields(message: pb.Message) -> dict[str, Any]:
    return {"role": message.role, "trust": pb.Trust.Name(message.trust), "content": message.content}


def _check(where: str, actual: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, want in expected.items():
        if key.endswith("_contains") and key not in actual:
            # `<field>_contains`: the actual <field> is a string holding this substring.
            field = key.removesuffix("_contains")
            got = actual.get(field)
            if type(want) is not str:
                raise Mismatch(f"{where}.{key}: expected a string to look for, got {want!r}")
            if type(got) is not str or want not in got:
                raise Mismatch(f"{where}.{key}: expected a {field} containing {want!r}, got {got!r}")
            continue
        if key not in actual:
            raise Mismatch(f"{where}.{key}: expected {want!r}, got nothing (no such entry)")
        got = actual[key]
        if isinstance(got, _Judged):
            got.judge(f"{where}.{key}", want)
        elif isinstance(want, dict):
            if not isinstance(got, dict):
                raise Mismatch(f"{where}.{key}: expected {want!r}, got {got!r}")
            _check(f"{where}.{key}", got, want)
        elif isinstance(want, list) and isinstance(got, list) and any(isinstance(item, dict) for item in [*got, *want]):
            # A list of objects (a transcript's `messages`): entry i checks object i, only its keys.
            if len(want) > len(got):
                raise Mismatch(f"{where}.{key}: expected at least {len(want)} entries, got {len(got)}")
            for index, item in enumerate(want):
                if not isinstance(item, dict) or not isinstance(got[index], dict):
                    raise Mismatch(f"{where}.{key}[{index}]: expected {item!r}, got {got[index]!r}")
                _check(f"{where}.{key}[{index}]", got[index], item)
        elif type(got) is not type(want) or got != want:
            raise Mismatch(f"{where}.{key}: expected {want!r}, got {got!r}")


def _page_args(where: str, args: dict[str, Any], next_token: str | None) -> tuple[int, str]:
    """A list or transcript step's page_size and page_token; `"$next"` is `next_token`, the
    next_page_token of the last step of the same verb that succeeded (None: there was none)."""
    if not isinstance(args, dict):
        raise Mismatch(f"{where}: the step's arguments must be an object, got {args!r}")
    size = args.get("page_size", 0)
    token = args.get("page_token", "")
    if type(size) is not int:
        raise Mismatch(f"{where}: page_size must be an integer, got {size!r}")
    if type(token) is not str:
        raise Mismatch(f"{where}: page_token must be a string, got {token!r}")
    if token == "$next":
        if next_token is None:
            raise Mismatch(f"{where}: page_token $next, but no earlier step of this verb returned a next_page_token")
        token = next_token
    return size, token


def _args(where: str, step: dict[str, Any], verb: str) -> dict[str, Any]:
    args = step[verb]
    if not isinstance(args, dict):
        raise Mismatch(f"{where}: the step's arguments must be an object, got {args!r}")
    return args


def _arg(where: str, args: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """An argument of the JSON type `kind` (bool is not an int); `default` when absent, and
    required when there is no default."""
    if key not in args:
        if default is None:
            raise Mismatch(f"{where}: missing argument {key!r}")
        return default
    value = args[key]
    if type(value) is not kind:
        raise Mismatch(f"{where}: {key} must be a {kind.__name__}, got {value!r}")
    return value


def _trust(where: str, name: str) -> pb.Trust.ValueType:
    try:
        return pb.Trust.Value(name)
    except ValueError:
        raise Mismatch(f"{where}: trust {name!r} is not a value of Trust") from None


def _check_details(where: str, error: AgentRuntimeError, want: dict[str, Any]) -> None:
    """`reason` (ErrorInfo), `resource` (ResourceInfo type and name), `violations` (the
    BadRequest fields, in order): tests/vectors/README.md, Expectations."""
    if "reason" in want and error.reason != want["reason"]:
        raise Mismatch(f"{where}: expected ErrorInfo reason {want['reason']!r}, got {error.reason!r}")
    if "resource" in want:
        info = error.resource_info
        got = {"type": info.resource_type, "name": info.resource_name} if info is not None else None
        if got != want["resource"]:
            raise Mismatch(f"{where}: expected ResourceInfo {want['resource']}, got {got}")
    if "violations" in want:
        request = error.bad_request
        fields = [violation.field for violation in request.field_violations] if request is not None else None
        if fields != want["violations"]:
            raise Mismatch(f"{where}: expected BadRequest fields {want['violations']}, got {fields}")


async def _inspect(client: Client, runtime_id: str, where: str, step: dict[str, Any]) -> dict[str, Any]:
    """One Inspect; with "poll", re-reads until the step's expect holds (a refused Inspect, such
    as NOT_FOUND before the handle is spawned, does not hold yet), at most POLL_FOR seconds."""
    args = _args(where, step, "inspect")
    handle = _arg(where, args, "handle", str)
    if not _arg(where, args, "poll", bool, False):
        return _view_fields(await client.inspect(runtime_id, handle))
    expected = step.get("expect")
    if not isinstance(expected, dict) or "expect_error" in step:
        raise Mismatch(f"{where}: a polling inspect needs an expect object and no expect_error")
    deadline = time.monotonic() + POLL_FOR
    while True:
        try:
            outcome = _view_fields(await client.inspect(runtime_id, handle))
            _check(where, outcome, expected)
            return outcome
        except (Mismatch, AgentRuntimeError) as problem:
            if time.monotonic() >= deadline:
                raise Mismatch(f"{where}: still not as expected after polling for {POLL_FOR:g} s: {problem}") from None
        await asyncio.sleep(POLL_EVERY)


async def _list_runtimes(client: Client, runtime_id: str, source: str | None, where: str, step: dict[str, Any]) -> dict[str, Any]:
    """Every page of ListRuntimes (of `page_size` each): whether this vector's runtime is among
    them and, when it is, its summary's counts, its fork's cut and whether it was forked from
    `source` (the runtime the vector's last fork forked; None: it made none)."""
    args = _args(where, step, "list_runtimes")
    size = _arg(where, args, "page_size", int, 0)
    token = ""
    outcome: dict[str, Any] = {"contains_this_runtime": False}
    while True:
        page = await client.list_runtimes_page(size, token)
        for summary in page.runtimes:
            if summary.runtime_id == runtime_id:
                outcome["contains_this_runtime"] = True
                outcome["this_runtime"] = {
                    "handle_count": summary.handle_count,
                    "running_count": summary.running_count,
                    "suspended_count": summary.suspended_count,
                    "total_tokens": summary.total_tokens,
                    "total_cost": _cost_fields(summary.total_cost),
                    "fork_seq": summary.fork_seq,
                    "forked_from_source": source is not None and summary.forked_from == source,
                }
        token = page.next_page_token
        if not token:
            return outcome


WORKER_HANDLERS = {
    "upper": lambda arguments, call: "".join(c.upper() if c.isascii() else c for c in str(arguments["text"])),
    "reverse": lambda arguments, call: str(arguments["text"])[::-1],
}


def _millis(where: str, args: dict[str, Any], key: str) -> int | None:
    value = args.get(key)
    if value is not None and (type(value) is not int or value < 0):
        raise Mismatch(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


async def _restart_server(after: float) -> None:
    """The restart hook (README: Waiting, restarts and watching), `after` seconds from now."""
    hook = os.environ.get("AGENTRUNTIME_RESTART_HOOK")
    if not hook:
        raise Mismatch("restart_server_after_ms needs AGENTRUNTIME_RESTART_HOOK (scripts/with-server.sh sets it)")
    await asyncio.sleep(after)
    process = await asyncio.create_subprocess_exec("sh", "-c", hook)
    if await process.wait() != 0:
        raise Mismatch(f"the restart hook exited with {process.returncode}")


async def _wait(client: Client, runtime_id: str, where: str, step: dict[str, Any]) -> pb.TaskResult:
    """The client's wait helper, through a client with a short default deadline and across a
    server restart when the step asks (README: Waiting, restarts and watching)."""
    args = _args(where, step, "wait")
    unknown = sorted(set(args) - set(WAIT_OPTIONS))
    if unknown:
        raise Mismatch(f"{where}: unknown wait arguments {unknown}")
    handle = _arg(where, args, "handle", str)
    client_timeout = _millis(where, args, "client_timeout_ms")
    restart_after = _millis(where, args, "restart_server_after_ms")
    restart = asyncio.ensure_future(_restart_server(restart_after / 1000)) if restart_after is not None else None
    try:
        if client_timeout is None:
            result = await client.wait(runtime_id, handle)
        else:
            async with Client(server_address(), timeout=client_timeout / 1000, **connection_options()) as short:
                result = await short.wait(runtime_id, handle)
        if restart is not None:
            await restart  # the hook's own failure fails the step, even when the wait got through
        return result
    finally:
        if restart is not None and not restart.done():
            restart.cancel()
            await asyncio.gather(restart, return_exceptions=True)


def _event_string(event: pb.Event) -> str:
    kind = event.WhichOneof("payload") or ""
    text = f"{event.handle_id} {kind}"
    if kind == "state_changed":
        text += " " + pb.HandleState.Name(event.state_changed.state)
    return text


async def _watch(client: Client, runtime_id: str, where: str, step: dict[str, Any]) -> dict[str, Any]:
    """The client's watch helper from the first event to `handle`'s first result."""
    handle = _arg(where, _args(where, step, "watch"), "handle", str)
    events: list[str] = []

    async def follow() -> None:
        async for event in client.watch(runtime_id):
            if event.seq != len(events) + 1:
                raise Mismatch(f"{where}: event seq {event.seq} after {len(events)} events (a gap or a repeat)")
            events.append(_event_string(event))
            if event.WhichOneof("payload") == "result" and event.handle_id == handle:
                return

    try:
        await asyncio.wait_for(follow(), CALL_TIMEOUT)
    except TimeoutError:
        raise Mismatch(f"{where}: no result event of {handle} within {CALL_TIMEOUT:.0f}s; events: {events}") from None
    return {"count": len(events), "events": events}


async def _stream_run(client: Client, runtime_id: str, where: str, step: dict[str, Any]) -> tuple[pb.TaskResult, dict[str, Any]]:
    """The client's stream-run helper: its result, and its text deltas joined in order (a
    `reset` empties what was joined of its turn) and counted (README: Waiting, restarts and
    watching)."""
    args = _args(where, step, "stream_run")
    agent, prompt = _arg(where, args, "agent", str), _arg(where, args, "prompt", str)
    parent = _arg(where, args, "parent", str, "root")
    turns: dict[int, list[str]] = {}  # each turn's pieces since its last reset, turns in the order they began
    counted = 0

    async def follow() -> pb.TaskResult:
        nonlocal counted
        async for item in client.stream_run(runtime_id, agent, prompt, parent):
            if isinstance(item, pb.TaskResult):
                return item
            piece = item.WhichOneof("piece")
            if piece == "reset":
                turns[item.turn] = []
            elif piece == "text":
                turns.setdefault(item.turn, []).append(item.text)
                counted += 1
        raise Mismatch(f"{where}: the stream-run helper ended without a result")

    try:
        result = await asyncio.wait_for(follow(), CALL_TIMEOUT)
    except TimeoutError:
        raise Mismatch(f"{where}: no result within {CALL_TIMEOUT:.0f}s; {counted} text deltas so far") from None
    joined = "".join("".join(pieces) for pieces in turns.values())
    return result, {"joined": joined, "text_deltas": counted}


async def start_workers(client: Client, entries: list[dict[str, Any]]) -> list[asyncio.Task[None]]:
    """The vector's workers (README: Workers), registered before its first step."""
    started: list[asyncio.Task[None]] = []
    for entry in entries:
        unknown = [name for name in entry["tools"] if name not in WORKER_HANDLERS]
        if unknown:
            raise Mismatch(f"workers: no handler for {unknown} (a broken vector)")
        handlers = {name: WORKER_HANDLERS[name] for name in entry["tools"]}
        registered = asyncio.Event()

        def announce(worker_id: str, event: asyncio.Event = registered) -> None:
            event.set()

        limit = int(entry.get("max_concurrent_calls", 1))
        started.append(
            asyncio.ensure_future(client.serve_tools(entry["queue"], handlers, max_concurrent_calls=limit, registered=announce))
        )
        await asyncio.wait_for(registered.wait(), CALL_TIMEOUT)
    return started


async def run_vector(client: Client, vector: dict[str, Any]) -> None:
    workers = await start_workers(client, vector.get("workers", []))
    try:
        await run_steps(client, vector)
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def run_steps(client: Client, vector: dict[str, Any]) -> None:
    agents = [json_format.ParseDict(agent, pb.AgentDef()) for agent in vector["agents"]]
    run = VectorRun(client, await client.create_runtime(agents), secrets.token_hex(8))
    for index, step in enumerate(vector["steps"]):
        await run.step(f"step {index + 1}", step)


@dataclass
class Reply:
    """One answer to a step's call: what the call returned (compared between a call and its
    repeat), or its refusal."""

    response: Any = None
    error: AgentRuntimeError | None = None

    def __str__(self) -> str:
        if self.error is not None:
            return f"the error {self.error}"
        if isinstance(self.response, Message):
            return f"the answer {{{text_format.MessageToString(self.response, as_one_line=True)}}}"
        return f"the answer {self.response!r}"


async def _reply(send: Callable[[], Awaitable[Any]]) -> Reply:
    try:
        return Reply(response=await send())
    except AgentRuntimeError as error:
        return Reply(error=error)


def _request_options(where: str, step: dict[str, Any], verb: str, token: str) -> tuple[str | None, bool]:
    """The request id to send (`<token>-<request_id>`; None: the client's own) and whether to
    send the call again (README: Request ids and repeats)."""
    if ("request_id" in step or "repeat" in step) and verb not in MUTATING:
        raise Mismatch(f"{where}: request_id and repeat go with a mutating verb ({', '.join(MUTATING)}), not {verb}")
    request_id = step.get("request_id")
    if "request_id" in step and (type(request_id) is not str or not REQUEST_ID.fullmatch(request_id)):
        raise Mismatch(f"{where}: request_id must be a string of at most 40 of [A-Za-z0-9_-], got {request_id!r}")
    repeat = step.get("repeat", False)
    if type(repeat) is not bool:
        raise Mismatch(f"{where}: repeat must be a boolean, got {repeat!r}")
    if repeat and request_id is None:
        raise Mismatch(f"{where}: repeat needs a request_id")
    return (None if request_id is None else f"{token}-{request_id}"), repeat


class VectorRun:
    """A vector's steps on its runtime, and what a step hands on to later ones: the last pending
    Request (for resume) and each paged verb's last next_page_token (for "$next")."""

    def __init__(self, client: Client, runtime_id: str, token: str) -> None:
        self.client = client
        self.runtime_id = runtime_id
        self.token = token  # drawn once per vector run: the prefix of its request ids
        self.last_pending: pb.Request | None = None
        self.next_list: str | None = None
        self.next_transcript: str | None = None
        self.source: str | None = None  # the runtime the last fork forked (this vector's before it)

    async def step(self, where: str, step: dict[str, Any]) -> None:
        verbs = [verb for verb in VERBS if verb in step]
        if len(verbs) != 1:
            raise Mismatch(f"{where}: a step has exactly one verb, got {verbs}")
        verb = verbs[0]
        request_id, repeat = _request_options(where, step, verb, self.token)
        send, outcome = self.prepare(where, step, verb, request_id)
        replies = [await _reply(send)]
        if repeat:
            replies.append(await _reply(send))
        try:
            if repeat:
                _alike(where, replies[0], replies[1])
            for reply in replies:
                _expect(where, step, reply, outcome)
        finally:
            if verb == "create_runtime":  # another runtime than the vector's: leave none behind
                for created in {reply.response for reply in replies if reply.error is None}:
                    await self.client.delete_runtime(created)

    def _pending(self, result: pb.TaskResult) -> pb.TaskResult:
        if result.status == pb.STATUS_PENDING:
            self.last_pending = result.pending
        return result

    def prepare(
        self, where: str, step: dict[str, Any], verb: str, request_id: str | None
    ) -> tuple[Callable[[], Awaitable[Any]], Callable[[Any], Any]]:
        """The step's call, made once (or twice, with `repeat`: the same request), and what a
        successful answer gives the step's `expect` to check."""
        client, runtime_id = self.client, self.runtime_id
        if verb == "spawn":
            args = step["spawn"]
            budget = json_format.ParseDict(args["budget"], pb.Budget()) if "budget" in args else None
            agent, parent = args["agent"], args["parent"]
            return (
                lambda: client.spawn(runtime_id, agent, parent, budget, request_id=request_id),
                lambda handle: {"handle_id": handle},
            )
        if verb == "wake":
            handle, prompt = step["wake"]["handle"], step["wake"].get("prompt", "")
            return lambda: client.wake(runtime_id, handle, prompt, request_id=request_id), lambda queued: None
        if verb == "wait":
            return lambda: _wait(client, runtime_id, where, step), lambda result: _result_fields(self._pending(result))
        if verb == "resume":
            answer = self._answer(where, step["resume"])
            return (
                lambda: client.resume(runtime_id, answer, request_id=request_id),
                lambda result: _result_fields(self._pending(result)),
            )
        if verb == "interrupt":
            handle = _arg(where, _args(where, step, "interrupt"), "handle", str)
            return (
                lambda: client.interrupt(runtime_id, handle, request_id=request_id),
                lambda interrupted: {"interrupted": interrupted},
            )
        if verb == "list":
            size, token = _page_args(where, step["list"], self.next_list)
            return lambda: client.list_page(runtime_id, size, token), self._listed
        if verb == "transcript":
            args = step["transcript"]
            size, token = _page_args(where, args, self.next_transcript)
            handle = args["handle"]
            return lambda: client.transcript_page(runtime_id, handle, size, token), self._transcribed
        if verb == "post":
            args = _args(where, step, "post")
            post = pb.PostRequest(
                runtime_id=runtime_id,
                handle_id=_arg(where, args, "handle", str),
                text=_arg(where, args, "text", str),
                sender=_arg(where, args, "sender", str, ""),
                channel=_arg(where, args, "channel", str, ""),
                trust=_trust(where, _arg(where, args, "trust", str, "TRUST_UNSPECIFIED")),
                coalesce_key=_arg(where, args, "coalesce_key", str, ""),
                request_id=request_id or "",  # empty: the client draws one, the same for every attempt
            )
            return lambda: client.call("Post", post), lambda response: {"inbox_size": response.inbox_size}
        if verb == "close":
            args = _args(where, step, "close")
            close = pb.CloseRequest(runtime_id=runtime_id, handle_id=_arg(where, args, "handle", str))
            close.force = _arg(where, args, "force", bool, False)
            close.request_id = request_id or ""
            if "grace_ms" in args:
                grace_ms = args["grace_ms"]
                if type(grace_ms) is not int:
                    raise Mismatch(f"{where}: grace_ms must be an integer, got {grace_ms!r}")
                grace = duration_pb2.Duration()
                grace.FromMilliseconds(grace_ms)
                close.grace.CopyFrom(grace)

            def closed(response: pb.CloseResponse) -> dict[str, Any]:
                return {"closed": list(response.closed_handle_ids), "count": len(response.closed_handle_ids)}

            return lambda: client.call("Close", close), closed
        if verb == "inspect":
            return lambda: _inspect(client, runtime_id, where, step), lambda outcome: outcome
        if verb == "list_runtimes":
            source = self.source
            return lambda: _list_runtimes(client, runtime_id, source, where, step), lambda outcome: outcome
        if verb == "delete_runtime":
            force = _arg(where, _args(where, step, "delete_runtime"), "force", bool, False)
            return lambda: client.delete_runtime(runtime_id, force, request_id=request_id), lambda response: None
        if verb == "create_runtime":
            definitions = _arg(where, _args(where, step, "create_runtime"), "agents", list)
            agents = [json_format.ParseDict(d, pb.AgentDef()) for d in definitions]
            return lambda: client.create_runtime(agents, request_id=request_id), lambda created: None
        if verb == "watch":
            return lambda: _watch(client, runtime_id, where, step), lambda outcome: outcome
        if verb == "stream_run":

            def streamed(outcome: tuple[pb.TaskResult, dict[str, Any]]) -> dict[str, Any]:
                result, text = outcome
                return {**_result_fields(self._pending(result)), **text}

            return lambda: _stream_run(client, runtime_id, where, step), streamed
        if verb == "fork":
            return self._fork(where, step)
        if verb == "replay":
            return self._replay(where, step)
        raise Mismatch(f"{where}: unknown verb in {sorted(step)}")

    def _fork(self, where: str, step: dict[str, Any]) -> tuple[Callable[[], Awaitable[Any]], Callable[[Any], Any]]:
        """ForkRuntime of this vector's runtime through the client's fork helper; once made, the
        fork is this vector's runtime, and the runtime it forked its source (README: Forks and
        replays)."""
        args = _args(where, step, "fork")
        at_seq = _arg(where, args, "at_seq", int)
        agents = [json_format.ParseDict(d, pb.AgentDef()) for d in _arg(where, args, "agents", list, [])]
        messages = []
        for entry in _arg(where, args, "messages", list, []):
            if not isinstance(entry, dict):
                raise Mismatch(f"{where}: each of messages must be an object, got {entry!r}")
            messages.append(pb.ForkMessage(handle_id=_arg(where, entry, "handle_id", str), text=_arg(where, entry, "text", str)))
        answers = [self._answer(where, _arg(where, args, "answer", dict))] if "answer" in args else []
        client, source = self.client, self.runtime_id

        def forked(response: pb.ForkRuntimeResponse) -> dict[str, Any]:
            self.source, self.runtime_id = source, response.runtime_id
            return {"fork_seq": response.fork_seq, "held": list(response.held_handle_ids)}

        return (
            lambda: client.fork_runtime(source, at_seq, agents=agents, messages=messages, answers=answers),
            forked,
        )

    def _replay(self, where: str, step: dict[str, Any]) -> tuple[Callable[[], Awaitable[Any]], Callable[[Any], Any]]:
        """ReplayRuntime of this vector's runtime through the client's replay helper (it asks
        again while the replay has not settled); this vector's runtime stays what it was."""
        args = _args(where, step, "replay")
        agents = [json_format.ParseDict(d, pb.AgentDef()) for d in _arg(where, args, "agents", list, [])]
        name = _arg(where, args, "unrecorded_calls", str, "UNRECORDED_CALLS_UNSPECIFIED")
        try:
            unrecorded = pb.UnrecordedCalls.Value(name)
        except ValueError:
            raise Mismatch(f"{where}: unrecorded_calls {name!r} is not a value of UnrecordedCalls") from None
        client, runtime_id = self.client, self.runtime_id

        def compared(response: pb.ReplayRuntimeResponse) -> dict[str, Any]:
            if not response.settled:
                raise Mismatch(f"{where}: the replay helper returned a replay that has not settled")
            return {
                "changed_count": response.changed_count,
                "count": len(response.diffs),
                "diffs": {
                    diff.handle_id: {
                        "changed": list(diff.changed),
                        "recorded": _result_fields(diff.recorded),
                        "replayed": _result_fields(diff.replayed),
                        "recorded_calls": [call.name for call in diff.recorded_calls],
                        "replayed_calls": [call.name for call in diff.replayed_calls],
                    }
                    for diff in response.diffs
                },
            }

        return lambda: client.replay_runtime(runtime_id, agents=agents, unrecorded_calls=unrecorded), compared

    def _answer(self, where: str, args: dict[str, Any]) -> pb.Answer:
        """The Answer to the last pending Request (README: resume)."""
        pending = self.last_pending
        calls = list(pending.calls) if pending else []
        answer = pb.Answer(
            id=args.get("id") or (pending.id if pending else ""),
            ok=args.get("ok", False),
            reason=args.get("reason", ""),
            outputs=[pb.ToolOutput(call_id=calls[i].id, output=text) for i, text in enumerate(args.get("outputs", []))],
        )
        if "data" in args:
            if not isinstance(args["data"], dict):
                raise Mismatch(f"{where}: data must be an object, got {args['data']!r}")
            answer.data.CopyFrom(json_format.ParseDict(args["data"], struct_pb2.Struct()))
        return answer

    def _listed(self, listed: pb.ListResponse) -> dict[str, Any]:
        self.next_list = listed.next_page_token
        return {
            "count": len(listed.handles),
            "handles": {view.handle_id: _view_fields(view) for view in listed.handles},
            "next_page_token_empty": not listed.next_page_token,
        }

    def _transcribed(self, page: pb.GetTranscriptResponse) -> dict[str, Any]:
        self.next_transcript = page.next_page_token
        return {
            "count": len(page.messages),
            "roles": [message.role for message in page.messages],
            "messages": [_message_fields(message) for message in page.messages],
            "next_page_token_empty": not page.next_page_token,
        }


def _alike(where: str, first: Reply, second: Reply) -> None:
    """A call and its repeat (same request, same request id) answered alike: equal responses
    (protobuf equality), or the same code and message."""
    if first.error is None and second.error is None:
        same = first.response == second.response
    elif first.error is not None and second.error is not None:
        same = (first.error.code, first.error.message) == (second.error.code, second.error.message)
    else:
        same = False
    if not same:
        raise Mismatch(f"{where}: the repeat was answered otherwise: {first}, then {second}")


def _expect(where: str, step: dict[str, Any], reply: Reply, outcome: Callable[[Any], Any]) -> None:
    """The step's `expect` (on what `outcome` makes of the answer) or `expect_error`."""
    error = reply.error
    if error is not None:
        if "expect_error" not in step:
            raise Mismatch(f"{where}: unexpected error {error}")
        want = step["expect_error"]
        if error.code.name != want["code"]:
            raise Mismatch(f"{where}: expected {want['code']}, got {error}")
        if "limit" in want:
            info = error.detail(error_details_pb2.ErrorInfo)
            limit = info.metadata.get("limit") if info else None
            if limit != want["limit"]:
                raise Mismatch(f"{where}: expected ErrorInfo limit {want['limit']}, got {limit}")
        _check_details(where, error, want)
        return
    checked = outcome(reply.response)  # also what a later step reads (a pending Request, a page token)
    if "expect_error" in step:
        raise Mismatch(f"{where}: expected {step['expect_error']['code']}, but the call succeeded")
    if "expect" in step:
        _check(where, checked, step["expect"])


def server_address() -> str:
    return os.environ.get("AGENTRUNTIME_ADDR", "127.0.0.1:50051")


def connection_options() -> dict[str, Any]:
    """The client's TLS and token from the environment (tests/vectors/README.md): each unset
    or empty variable leaves its option out."""
    env = {
        name: os.environ.get(f"AGENTRUNTIME_{name}") or None
        for name in ("CA_FILE", "CLIENT_CERT_FILE", "CLIENT_KEY_FILE", "TOKEN")
    }
    return {
        "root_certificates": Path(env["CA_FILE"]) if env["CA_FILE"] else None,
        "client_cert": Path(env["CLIENT_CERT_FILE"]) if env["CLIENT_CERT_FILE"] else None,
        "client_key": Path(env["CLIENT_KEY_FILE"]) if env["CLIENT_KEY_FILE"] else None,
        "token": env["TOKEN"],
    }


async def run_all(address: str, vectors: list[tuple[str, str]]) -> int:
    passed = failed = 0
    async with Client(address, timeout=CALL_TIMEOUT, **connection_options()) as client:
        for name, text in vectors:
            try:
                vector = json.loads(text)
                await run_vector(client, vector)
            except (Mismatch, AgentRuntimeError, json_format.ParseError, KeyError, IndexError, TypeError, ValueError) as problem:
                failed += 1
                print(f"FAIL {name}: {type(problem).__name__}: {problem}")
            else:
                passed += 1
                print(f"ok   {name}")
    print(f"conformance: {passed} passed, {failed} failed")
    return 1 if failed else 0


def main() -> int:
    address = server_address()
    folder = Path(os.environ.get("AGENTRUNTIME_VECTORS", DEFAULT_VECTORS))
    vectors = [(path.stem, path.read_text()) for path in sorted(folder.glob("*.json"))]
    if not vectors:
        print(f"conformance: no vectors in {folder}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_all(address, vectors))
    except ValueError as error:  # an unreadable AGENTRUNTIME_*_FILE (a vector's own errors are caught per vector)
        print(f"conformance: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
