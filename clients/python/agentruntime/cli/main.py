"""The commands: argument parsing, one coroutine per command, errors as `error: CODE: message`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.rpc import error_details_pb2
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from agentruntime.client import AgentRuntimeError, Client
from agentruntime.v1 import agent_runtime_pb2 as pb

from . import COMMANDS, command_first
from .ask import Asker, LineReader, NoAnswer
from .view import (
    Streamed,
    Tree,
    columns,
    cost_text,
    event_line,
    handle_lines,
    key_values,
    printable,
    request_lines,
    reset_marker,
    result_lines,
    state_name,
    status_name,
)

DEFAULT_ADDR = "127.0.0.1:50051"
# Seconds a call that fails with UNAVAILABLE (a server restarting, a runtime moving between
# replicas) is retried for: a restart goes unnoticed, and a person whose server is not running
# learns it soon (the client's own default, 60 s, is for services).
DEFAULT_RETRY_WINDOW = 10.0
EXIT_OK, EXIT_NOT_DONE, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
# `replay --unrecorded`: what a tool call the recording does not have does.
UNRECORDED = {
    "recorded-only": pb.UNRECORDED_CALLS_RECORDED_ONLY,
    "live": pb.UNRECORDED_CALLS_LIVE,
    "host": pb.UNRECORDED_CALLS_HOST,
}


class Failure(Exception):
    """A mistake caught before (or without) asking the server: a file, an argument."""


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    connection = common.add_argument_group("connection")
    connection.add_argument(
        "--addr",
        default=os.environ.get("AGENTRUNTIME_ADDR", DEFAULT_ADDR),
        help=f"server host:port (env AGENTRUNTIME_ADDR; default {DEFAULT_ADDR})",
    )
    connection.add_argument("--token", default=os.environ.get("AGENTRUNTIME_TOKEN"), help="bearer token (env AGENTRUNTIME_TOKEN)")
    connection.add_argument(
        "--tls",
        action="store_true",
        default=os.environ.get("AGENTRUNTIME_TLS", "").lower() in ("1", "true", "yes"),
        help="connect with TLS (env AGENTRUNTIME_TLS=1)",
    )
    connection.add_argument(
        "--ca",
        type=Path,
        default=_env_path("AGENTRUNTIME_CA_FILE"),
        help="PEM CA certificates to verify the server with, implies --tls (default: the system's; env AGENTRUNTIME_CA_FILE)",
    )
    connection.add_argument(
        "--cert",
        type=Path,
        default=_env_path("AGENTRUNTIME_CLIENT_CERT_FILE"),
        help="PEM client certificate for mTLS, with --key; implies --tls (env AGENTRUNTIME_CLIENT_CERT_FILE)",
    )
    connection.add_argument(
        "--key",
        type=Path,
        default=_env_path("AGENTRUNTIME_CLIENT_KEY_FILE"),
        help="PEM private key of --cert (env AGENTRUNTIME_CLIENT_KEY_FILE)",
    )
    connection.add_argument(
        "--retry-window",
        type=_seconds,
        default=os.environ.get("AGENTRUNTIME_RETRY_WINDOW") or str(DEFAULT_RETRY_WINDOW),
        metavar="SECONDS",
        help="retry a call that fails with UNAVAILABLE (a restarting server) for up to this long; 0: no retries"
        f" (env AGENTRUNTIME_RETRY_WINDOW; default {DEFAULT_RETRY_WINDOW:g})",
    )

    parser = argparse.ArgumentParser(prog="agentruntime", description="Operate an agentruntime server.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], help=COMMANDS[name], description=COMMANDS[name] + ".")

    run = command("run")
    run.add_argument("file", type=Path, help="a CreateRuntimeRequest in proto3 JSON, e.g. examples/agents.json")
    run.add_argument("--agent", help="the agent to run (default: the file's first)")
    run.add_argument("--prompt", help="what to ask it (default: the first line of standard input)")
    run.add_argument(
        "--runtime-id",
        help="the runtime's id (default: the file's runtime_id plus a short random suffix, so the file can run again)",
    )
    run.add_argument("--plain", action="store_true", help="print event lines, not the live tree (the default off a terminal)")

    ls = command("ls")
    ls.add_argument("runtime")
    ls.add_argument("--json", action="store_true", help="print the ListResponse as proto3 JSON")

    inspect = command("inspect")
    inspect.add_argument("runtime")
    inspect.add_argument("handle")
    inspect.add_argument("--json", action="store_true", help="print the HandleView as proto3 JSON")

    transcript = command("transcript")
    transcript.add_argument("runtime")
    transcript.add_argument("handle")
    transcript.add_argument("--json", action="store_true", help="print the GetTranscriptResponse as proto3 JSON")

    resume = command("resume")
    resume.add_argument("runtime")
    resume.add_argument("--id", required=True, help="the pending Request's id")
    verdict = resume.add_mutually_exclusive_group()
    verdict.add_argument("--ok", dest="ok", action="store_true", default=True, help="approve / answer (the default)")
    verdict.add_argument("--no", dest="ok", action="store_false", help="decline")
    resume.add_argument("--output", action="append", default=[], metavar="CALL_ID=TEXT", help="a tool call's output (repeatable)")
    resume.add_argument("--data", help="the Answer's data, a JSON object (an `input` request's answer)")
    resume.add_argument("--reason", default="", help="why (with --no)")
    resume.add_argument("--json", action="store_true", help="print the TaskResult as proto3 JSON")

    runtimes = command("runtimes")
    runtimes.add_argument("--json", action="store_true", help="print the ListRuntimesResponse as proto3 JSON")
    runtimes.add_argument("--forks-of", default="", metavar="RUNTIME", help="only the forks and replays of this runtime")

    rm = command("rm")
    rm.add_argument("runtime")
    rm.add_argument("--force", action="store_true", help="interrupt running handles (without it a running runtime is refused)")

    fork = command("fork")
    fork.add_argument("runtime", help="the runtime to fork (the source; it is not changed)")
    fork.add_argument(
        "--at", type=int, required=True, metavar="SEQ", help="the cut: the seq of one of its events (`watch` shows them)"
    )
    fork.add_argument(
        "--definitions",
        type=Path,
        metavar="FILE",
        help="agent definitions that replace the source's of the same name (or are added): a file like `run`'s",
    )
    fork.add_argument("--runtime-id", default="", help="the fork's id (default: the server makes one)")
    fork.add_argument("--json", action="store_true", help="print the ForkRuntimeResponse as proto3 JSON")

    replay = command("replay")
    replay.add_argument("runtimes", nargs="+", metavar="RUNTIME", help="the recorded runtimes to replay")
    replay.add_argument(
        "--definitions",
        type=Path,
        required=True,
        metavar="FILE",
        help="the agent definitions to replay them with (by name): a file like `run`'s",
    )
    replay.add_argument(
        "--unrecorded",
        choices=list(UNRECORDED),
        default="recorded-only",
        help="what a tool call the recording does not have does: an error result (recorded-only, the default),"
        " runs (live), or asks you (host)",
    )
    replay.add_argument("--json", action="store_true", help="print each ReplayRuntimeResponse as proto3 JSON")

    watch = command("watch")
    watch.add_argument("runtime")
    watch.add_argument(
        "--after", type=int, default=0, metavar="SEQ", help="start after this event (default 0: the whole history)"
    )
    return parser


def run_cli(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(command_first(sys.argv[1:] if argv is None else argv))
    try:
        return asyncio.run(_dispatch(args))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, or SIGTERM
        if args.command == "watch":
            return EXIT_OK
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `agentruntime watch rt | head`: the reader is gone
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


async def _dispatch(args: argparse.Namespace) -> int:
    handlers: dict[str, Callable[[argparse.Namespace, Client], Awaitable[int]]] = {
        "run": _run,
        "ls": _ls,
        "inspect": _inspect,
        "transcript": _transcript,
        "resume": _resume,
        "watch": _watch,
        "runtimes": _runtimes,
        "rm": _rm,
        "fork": _fork,
        "replay": _replay,
    }
    task = asyncio.current_task()
    if task is not None:  # SIGTERM stops a command as Ctrl-C does (a background job ignores SIGINT)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        pem = _read_pem(args)
    except Failure as error:
        return _fail(str(error))
    # Run, Resume, Watch and Replay last as long as the agents do: no deadline (a replay's
    # attempts have their own). The rest are quick.
    timeout = None if args.command in ("run", "resume", "watch", "replay") else 30.0
    client = Client(
        args.addr,
        token=args.token,
        tls=args.tls,
        root_certificates=pem["ca"],
        client_cert=pem["cert"],
        client_key=pem["key"],
        timeout=timeout,
        retries=args.retry_window > 0,
        retry_window=args.retry_window,
    )
    try:
        return await handlers[args.command](args, client)
    except AgentRuntimeError as error:
        _report(error, args.addr)
        return EXIT_ERROR
    except Failure as error:
        return _fail(str(error))
    finally:
        await client.close_channel()


def _read_pem(args: argparse.Namespace) -> dict[str, bytes | None]:
    """The PEM files of --ca, --cert and --key (None: not given)."""
    if (args.cert is None) != (args.key is None):
        raise Failure("--cert and --key go together (mTLS): give both, or neither")
    pem: dict[str, bytes | None] = {}
    for flag in ("ca", "cert", "key"):
        path: Path | None = getattr(args, flag)
        try:
            pem[flag] = path.read_bytes() if path else None
        except OSError as error:
            raise Failure(f"cannot read --{flag} {path}: {error.strerror}") from None
    return pem


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _report(error: AgentRuntimeError, addr: str) -> None:
    lines = [f"error: {error.code.name}: {error.message}"]
    bad_request = error.detail(error_details_pb2.BadRequest)
    if bad_request is not None:
        lines += [f"  {violation.field}: {violation.description}" for violation in bad_request.field_violations]
    info = error.detail(error_details_pb2.ErrorInfo)
    if info is not None and info.reason:
        metadata = "".join(f", {key}={value}" for key, value in sorted(info.metadata.items()))
        lines.append(f"  reason: {info.reason}{metadata}")
    if error.code is grpc.StatusCode.UNAVAILABLE:
        lines.append(f"  is an agentruntime server listening at {addr}? (`make run`, or --addr / AGENTRUNTIME_ADDR)")
    print(printable("\n".join(lines)), file=sys.stderr)


def _print(text: str = "") -> None:
    print(printable(text), flush=True)


# --- run ------------------------------------------------------------------------------------


def load_runtime_file(path: Path) -> pb.CreateRuntimeRequest:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise Failure(f"cannot read {path}: {error.strerror}") from None
    try:
        return json_format.Parse(text, pb.CreateRuntimeRequest())
    except json_format.ParseError as error:
        raise Failure(f"{path} is not a CreateRuntimeRequest in proto3 JSON: {error}") from None


def unique_runtime_id(base: str) -> str:
    """The file's id plus a short random suffix (ids are unique on a server); empty: the server picks."""
    return f"{base[:57]}-{secrets.token_hex(3)}" if base else ""


class RunView:
    """The live tree on a terminal, with the text the run's handle writes under it as it
    streams; anywhere else one line per event, and that text printed as it comes."""

    def __init__(self, tree: Tree, live: bool) -> None:
        self.tree = tree
        self.live = live
        self.console = Console(highlight=False)
        self.streamed = Streamed()
        self._live: Live | None = None
        self._paused = False
        self._held: list[pb.Event | pb.Delta] = []  # what came while a question was on the screen
        self._midline = False  # plain: streamed text ended without a newline

    def start(self) -> None:
        self._paused = False
        held, self._held = self._held, []
        for item in held:
            if isinstance(item, pb.Delta):
                self.delta(item)
            else:
                self.event(item)
        if self.live and self._live is None:
            self._live = Live(console=self.console, get_renderable=self.render, refresh_per_second=8)
            self._live.start()

    def stop(self) -> None:
        """Freezes the screen (to ask a question, or at the end): events are held until `start`."""
        self._paused = True
        if self._live is not None:
            self._live.stop()  # the last frame stays on the screen
            self._live = None

    def render(self) -> RenderableType:
        tree = self.tree.render()
        # The tree's rows and the heading's stay on the screen; the text gets what is left.
        room = max(3, self.console.height - len(self.tree.nodes) - 8)
        streamed = self.streamed.render(self.console, room)
        return tree if streamed is None else Group(tree, streamed)

    def event(self, event: pb.Event) -> None:
        if self._paused:
            self._held.append(event)
            return
        self.tree.apply(event)
        self.streamed.end(event)
        if not self.live:
            self._line_start()
            _print(event_line(event))

    def delta(self, delta: pb.Delta) -> None:
        """A piece the run's handle wrote: its text goes on the screen at once; a reset says so."""
        if self._paused:
            self._held.append(delta)
            return
        self.streamed.apply(delta)
        if self.live:
            return
        piece = delta.WhichOneof("piece")
        if piece == "text" and delta.text:
            print(printable(delta.text), end="", flush=True)
            self._midline = not delta.text.endswith("\n")
        elif piece == "reset":
            self._line_start()
            self.console.print(reset_marker(delta.reset), style="dim", markup=False)

    def _line_start(self) -> None:
        """Ends streamed text that stopped mid-line, so that what follows starts a line."""
        if self._midline:
            print(flush=True)
            self._midline = False

    def say(self, text: str) -> None:
        """A question, with no newline: the answer is typed after it."""
        if self.live:
            self.console.print(printable(text), end="", markup=False)
        else:
            self._line_start()
            print(printable(text), end="", flush=True)

    def block(self, title: str, rows: list[tuple[str, str]]) -> None:
        if self.live:
            self.console.rule(title, align="left", style="dim")
            self.console.print(printable(key_values(rows)), markup=False)
        else:
            self._line_start()
            _print(f"--- {title}")
            _print(key_values(rows))


async def _run(args: argparse.Namespace, client: Client) -> int:
    request = load_runtime_file(args.file)
    names = [agent.name for agent in request.agents]
    if not names:
        raise Failure(f"{args.file} defines no agents")
    agent = args.agent or names[0]
    if agent not in names:
        raise Failure(f"{args.file} defines no agent {agent!r}; it defines {names}")
    reader = LineReader()
    interactive = sys.stdin.isatty()
    tree = Tree("")
    view = RunView(tree, live=sys.stdout.isatty() and not args.plain)
    asker = Asker(reader, view.say, interactive)
    prompt = args.prompt
    if prompt is None:
        with contextlib.suppress(NoAnswer):
            prompt = await asker.line("prompt: ") if interactive else await reader.readline()
    if not prompt or not prompt.strip():
        raise Failure("no prompt: pass --prompt TEXT, or give it as the first line of standard input")

    wanted = args.runtime_id if args.runtime_id is not None else unique_runtime_id(request.runtime_id)
    runtime_id = await client.create_runtime(request.agents, wanted)
    tree.runtime_id, tree.started = runtime_id, time.monotonic()
    handle_id = await client.spawn(runtime_id, agent)
    _print(f"runtime {runtime_id} created from {args.file}; running {handle_id}")

    results: asyncio.Queue[pb.TaskResult | Exception] = asyncio.Queue()
    # Set once the Watch answers (or fails): a provider's turn streams to the watchers there when it starts.
    watching = asyncio.Event()

    async def follow() -> None:
        try:
            async for item in client.watch_with_deltas(runtime_id):
                watching.set()
                if isinstance(item, pb.Delta):
                    if item.handle_id == handle_id:
                        view.delta(item)
                    continue
                view.event(item)
                if item.handle_id == handle_id and item.WhichOneof("payload") == "result":
                    results.put_nowait(item.result)
        except Exception as error:  # a refused Watch, or stdout gone (`| head`): the run loop raises it
            results.put_nowait(error)
            watching.set()

    watcher = asyncio.create_task(follow())
    view.start()
    try:
        await watching.wait()
        if results.empty():  # else the Watch failed: its error comes first
            await client.wake(runtime_id, handle_id, prompt)
        while True:
            item = await results.get()
            if isinstance(item, Exception):
                raise item
            result = item
            if result.status != pb.STATUS_PENDING:
                break
            view.stop()
            view.block("the run waits for you", request_lines(result.pending))
            try:
                answer = await asker.answer(result.pending)
            except NoAnswer:
                view.say("\n")
                _print(f"no answer on standard input; answer with: agentruntime resume {runtime_id} --id {result.pending.id} ...")
                break
            view.start()
            try:
                await client.resume(runtime_id, answer)
            except AgentRuntimeError as error:
                if error.code is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
    except asyncio.CancelledError:
        view.stop()
        print(f"stopped watching; runtime {runtime_id} goes on on the server: agentruntime watch {runtime_id}", file=sys.stderr)
        raise
    finally:
        view.stop()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    view.block("result", result_lines(result))
    return EXIT_OK if result.status == pb.STATUS_DONE else EXIT_NOT_DONE


# --- the other commands ---------------------------------------------------------------------


def _json(message: object) -> None:
    _print(json_format.MessageToJson(message, preserving_proto_field_name=True))  # type: ignore[arg-type]


async def _ls(args: argparse.Namespace, client: Client) -> int:
    handles = await client.list_handles(args.runtime)
    if args.json:
        _json(pb.ListResponse(handles=handles))
        return EXIT_OK
    headers = ["handle", "agent", "state", "turns", "own", "total", "cost", "tools", "last", "pending"]
    rows = [
        [
            view.handle_id,
            view.agent,
            state_name(view.state),
            str(view.turns),
            str(view.own_tokens),
            str(view.total_tokens),
            cost_text(view.total_cost),
            str(view.tool_calls),
            status_name(view.last_status) if view.last_status else "-",
            view.pending_kind or "-",
        ]
        for view in handles
    ]
    _table(headers, rows)
    return EXIT_OK


async def _inspect(args: argparse.Namespace, client: Client) -> int:
    view = await client.inspect(args.runtime, args.handle)
    if args.json:
        _json(view)
    else:
        _print(key_values(handle_lines(view)))
    return EXIT_OK


async def _transcript(args: argparse.Namespace, client: Client) -> int:
    messages = await client.transcript(args.runtime, args.handle)
    if args.json:
        _json(pb.GetTranscriptResponse(messages=messages))
        return EXIT_OK
    for message in messages:
        if message.role == "assistant":
            head = f"assistant (turn {message.turn})"
        elif message.role == "tool":
            head = f"tool {message.tool_call_id}" + (" (error)" if message.is_error else "")
        else:
            head = message.role
        lines = message.content.splitlines()
        _print(f"{head}: {lines[0]}" if lines else f"{head}:")
        for line in lines[1:]:
            _print(f"  {line}")
        for call in message.tool_calls:
            _print(f"  → {call.name} {call.id} {call.arguments_json}")
    return EXIT_OK


async def _resume(args: argparse.Namespace, client: Client) -> int:
    answer = pb.Answer(id=args.id, ok=args.ok, reason=args.reason)
    for item in args.output:
        call_id, separator, text = item.partition("=")
        if not separator or not call_id:
            raise Failure(f"--output {item!r}: write CALL_ID=TEXT")
        answer.outputs.add(call_id=call_id, output=text)
    if args.data is not None:
        try:
            data = json.loads(args.data)
        except ValueError as error:
            raise Failure(f"--data is not JSON: {error}") from None
        if not isinstance(data, dict):
            raise Failure("--data must be a JSON object")
        answer.data.CopyFrom(struct_pb2.Struct())
        answer.data.update(data)
    result = await client.resume(args.runtime, answer)
    if args.json:
        _json(result)
    else:
        _print(key_values(result_lines(result)))
        if result.status == pb.STATUS_PENDING:
            _print("--- the run waits for an answer again")
            _print(key_values(request_lines(result.pending)))
    return EXIT_OK if result.status == pb.STATUS_DONE else EXIT_NOT_DONE


def _table(headers: list[str], rows: list[list[str]]) -> None:
    if sys.stdout.isatty():
        table = Table(*headers, header_style="bold")
        for row in rows:
            table.add_row(*(printable(cell) for cell in row))
        Console(highlight=False).print(table)
    else:
        _print(columns(headers, rows))


def _when(timestamp: timestamp_pb2.Timestamp) -> str:
    return timestamp.ToDatetime(datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


async def _runtimes(args: argparse.Namespace, client: Client) -> int:
    runtimes = await client.list_runtimes(forks_of=args.forks_of)
    if args.json:
        _json(pb.ListRuntimesResponse(runtimes=runtimes))
        return EXIT_OK
    headers = ["runtime", "created", "handles", "running", "suspended", "tokens", "cost"]
    rows = [
        [
            summary.runtime_id,
            _when(summary.create_time) if summary.HasField("create_time") else "-",
            str(summary.handle_count),
            str(summary.running_count),
            str(summary.suspended_count),
            str(summary.total_tokens),
            cost_text(summary.total_cost),
        ]
        for summary in runtimes
    ]
    _table(headers, rows)
    return EXIT_OK


async def _rm(args: argparse.Namespace, client: Client) -> int:
    await client.delete_runtime(args.runtime, force=args.force)
    _print(f"deleted runtime {args.runtime}")
    return EXIT_OK


async def _watch(args: argparse.Namespace, client: Client) -> int:
    if args.after < 0:
        raise Failure("--after must be >= 0")
    await client.list_handles(args.runtime)  # a clear error now for a wrong runtime or server
    async for event in client.watch(args.runtime, args.after):
        _print(event_line(event))
    return EXIT_OK


def _definitions(path: Path) -> list[pb.AgentDef]:
    """The agents of a runtime file (`run`'s format: a CreateRuntimeRequest in proto3 JSON)."""
    agents = list(load_runtime_file(path).agents)
    if not agents:
        raise Failure(f"{path} defines no agents")
    return agents


async def _fork(args: argparse.Namespace, client: Client) -> int:
    if args.at < 1:
        raise Failure("--at is an event's seq: 1 or more")
    agents = _definitions(args.definitions) if args.definitions is not None else []
    forked = await client.fork_runtime(args.runtime, args.at, runtime_id=args.runtime_id, agents=agents)
    if args.json:
        _json(forked)
        return EXIT_OK
    rows = [
        ("runtime", forked.runtime_id),
        ("forked from", args.runtime),
        ("fork seq", str(forked.fork_seq)),
        ("held", "\n".join(forked.held_handle_ids) or "-"),
    ]
    _print(key_values(rows))
    if forked.held_handle_ids:
        _print(f"a Wake continues a held handle: agentruntime watch {forked.runtime_id} shows it go on")
    return EXIT_OK


def _changed(before: str, after: str) -> str:
    return before if before == after else f"{before}→{after}"


def replay_rows(source: str, response: pb.ReplayRuntimeResponse) -> list[list[str]]:
    """One row per root: the recording's figures and the replay's (`A→B` where they differ)."""
    rows = []
    for diff in response.diffs:
        recorded, replayed = diff.recorded, diff.replayed
        rows.append(
            [
                source,
                diff.handle_id,
                _changed(status_name(recorded.status), status_name(replayed.status)),
                _changed(str(recorded.turns), str(replayed.turns)),
                _changed(str(recorded.total_tokens), str(replayed.total_tokens)),
                _changed(cost_text(recorded.total_cost), cost_text(replayed.total_cost)),
                ",".join(diff.changed) or "-",
            ]
        )
    return rows


def status_changed(response: pb.ReplayRuntimeResponse) -> bool:
    return any("status" in diff.changed or diff.recorded.status != diff.replayed.status for diff in response.diffs)


async def _replay(args: argparse.Namespace, client: Client) -> int:
    agents = _definitions(args.definitions)
    replays: list[tuple[str, pb.ReplayRuntimeResponse]] = []
    for source in args.runtimes:
        response = await client.replay_runtime(source, agents=agents, unrecorded_calls=UNRECORDED[args.unrecorded])
        replays.append((source, response))
    changed = any(status_changed(response) for _, response in replays)
    if args.json:
        for _, response in replays:
            _json(response)
        return EXIT_NOT_DONE if changed else EXIT_OK
    headers = ["runtime", "handle", "status", "turns", "tokens", "cost", "changed"]
    _table(headers, [row for source, response in replays for row in replay_rows(source, response)])
    for source, response in replays:
        roots = len(response.diffs)
        _print(f"{source}: replayed as {response.runtime_id}, {response.changed_count} of {roots} roots changed")
    if changed:
        _print("a status changed")
    return EXIT_NOT_DONE if changed else EXIT_OK
