"""What the CLI shows: a tree of handles folded from Watch events, event lines, results and requests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from google.protobuf import json_format
from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from agentruntime.v1 import agent_runtime_pb2 as pb

STATE_STYLES = {
    "RUNNING": "bold yellow",
    "QUEUED": "yellow",
    "SUSPENDED": "bold magenta",
    "IDLE": "green",
    "CLOSED": "dim",
    "HELD": "cyan",  # a fork's run in flight at its cut: a Wake continues it
}


def state_name(state: int) -> str:
    return pb.HandleState.Name(state).removeprefix("HANDLE_STATE_")  # type: ignore[arg-type]


def status_name(status: int) -> str:
    return pb.Status.Name(status).removeprefix("STATUS_")  # type: ignore[arg-type]


def cost_text(cost: pb.Cost) -> str:
    """`0.0123 USD`; `*` when a call it covers had no price; `-` for nothing priced at all."""
    if not cost.currency and not cost.micros:
        return "-" if cost.priced else "unpriced"
    return f"{cost.micros / 1_000_000:.4f} {cost.currency}{'' if cost.priced else '*'}"


def failure_name(reason: int) -> str:
    return pb.FailureReason.Name(reason).removeprefix("FAILURE_REASON_")  # type: ignore[arg-type]


def limit_name(limit: int) -> str:
    return pb.Limit.Name(limit).removeprefix("LIMIT_")  # type: ignore[arg-type]


# Control characters but tab and newline: what a model, a tool or a host wrote must not move
# the cursor, clear or retitle the terminal, or write to its clipboard (OSC 52).
_CONTROL = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if code not in (0x09, 0x0A)}


def printable(text: str) -> str:
    """The text with its control characters escaped (`\\x1b`), safe to write to a terminal."""
    return text.translate(_CONTROL)


def short(text: str, width: int = 80) -> str:
    """One line, at most `width` characters."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def call_label(call: pb.ToolCall) -> str:
    """`task → explore` for a delegation, `deploy` for any other tool."""
    if call.name == "task":
        try:
            agent = json.loads(call.arguments_json or "{}").get("agent", "?")
        except (ValueError, AttributeError):
            agent = "?"
        return f"task → {agent}"
    return call.name


@dataclass
class Node:
    handle_id: str
    parent_id: str
    agent: str
    state: int = pb.HANDLE_STATE_IDLE
    turns: int = 0
    own_tokens: int = 0
    reported_total: int = 0
    total_cost: pb.Cost = field(default_factory=lambda: pb.Cost(priced=True))  # the latest the server reported
    turn_in_flight: int = 0
    calls: dict[str, str] = field(default_factory=dict)
    pending: pb.Request | None = None
    last_status: int = pb.STATUS_UNSPECIFIED
    children: list[str] = field(default_factory=list)

    @property
    def segment(self) -> str:
        return self.handle_id.rsplit("/", 1)[-1]


class Tree:
    """The handles of one runtime as its events describe them, kept current event by event.

    A parent's total is its own spend plus its children's totals (the server's invariant),
    so a child's turn shows in every ancestor's total at once, before their next event."""

    def __init__(self, runtime_id: str) -> None:
        self.runtime_id = runtime_id
        self.nodes: dict[str, Node] = {}
        self.last_seq = 0
        self.started = time.monotonic()

    def node(self, handle_id: str) -> Node:
        found = self.nodes.get(handle_id)
        if found is None:  # an event for a handle spawned before the events we saw
            parent_id = handle_id.rsplit("/", 1)[0]
            found = self.nodes[handle_id] = Node(handle_id, parent_id, found_agent(handle_id))
            if parent_id in self.nodes:
                self.nodes[parent_id].children.append(handle_id)
        return found

    def apply(self, event: pb.Event) -> None:
        self.last_seq = max(self.last_seq, event.seq)
        kind = event.WhichOneof("payload")
        if kind == "spawned":
            if event.handle_id not in self.nodes:
                self.nodes[event.handle_id] = Node(event.handle_id, event.spawned.parent_id, event.spawned.agent)
                if event.spawned.parent_id in self.nodes:
                    self.nodes[event.spawned.parent_id].children.append(event.handle_id)
            return
        node = self.node(event.handle_id)
        if kind == "state_changed":
            node.state = event.state_changed.state
            if node.state == pb.HANDLE_STATE_RUNNING:
                node.pending = None
            else:
                node.calls.clear()
                node.turn_in_flight = 0
        elif kind == "turn_started":
            node.turn_in_flight = event.turn_started.turn
        elif kind == "turn_ended":
            ended = event.turn_ended
            node.turn_in_flight = 0
            node.turns = max(node.turns, ended.turn)
            node.own_tokens = max(node.own_tokens, ended.own_tokens)
            node.reported_total = max(node.reported_total, ended.total_tokens)
            if ended.HasField("total_cost") and ended.total_cost.micros >= node.total_cost.micros:
                node.total_cost = ended.total_cost
        elif kind == "tool_call_started":
            node.calls[event.tool_call_started.call.id] = call_label(event.tool_call_started.call)
        elif kind == "tool_call_ended":
            node.calls.pop(event.tool_call_ended.call_id, None)
        elif kind == "pending":
            node.pending = event.pending
        elif kind == "result":
            result = event.result
            node.last_status = result.status
            node.turns = max(node.turns, result.turns)
            node.own_tokens = max(node.own_tokens, result.own_tokens)
            node.reported_total = max(node.reported_total, result.total_tokens)
            if result.HasField("total_cost") and result.total_cost.micros >= node.total_cost.micros:
                node.total_cost = result.total_cost
            node.pending = result.pending if result.status == pb.STATUS_PENDING else None
            # The state change follows this event; show the settled state at once, as the server sets it.
            node.calls.clear()
            node.turn_in_flight = 0
            if result.status == pb.STATUS_PENDING:
                node.state = pb.HANDLE_STATE_SUSPENDED
            elif result.status == pb.STATUS_CLOSED:
                node.state = pb.HANDLE_STATE_CLOSED
            elif node.state != pb.HANDLE_STATE_CLOSED:
                node.state = pb.HANDLE_STATE_IDLE

    def total(self, handle_id: str) -> int:
        node = self.nodes[handle_id]
        rolled = node.own_tokens + sum(self.total(child) for child in node.children)
        return max(node.reported_total, rolled)

    def activity(self, node: Node) -> str:
        if node.state == pb.HANDLE_STATE_RUNNING:
            if node.turn_in_flight:
                return f"model turn {node.turn_in_flight}"
            if node.calls:
                return ", ".join(node.calls.values())
            return "running"
        if node.state == pb.HANDLE_STATE_SUSPENDED or node.pending is not None:
            request = node.pending
            if request is None:
                return "suspended"
            if list(request.path) and request.path[-1] != node.segment:
                return f"waiting on {request.path[-1]}"
            names = ", ".join(call.name for call in request.calls)
            return f"waiting for you: {request.kind}" + (f" ({names})" if names else "")
        if node.state == pb.HANDLE_STATE_CLOSED:
            return "closed"
        return status_name(node.last_status).lower() if node.last_status else ""

    def walk(self) -> Iterator[tuple[str, Node]]:
        """Every node depth first, in spawn order, with its tree-drawn label."""
        tops = [node for node in self.nodes.values() if node.parent_id not in self.nodes]

        def visit(node: Node, prefix: str, last: bool, depth: int) -> Iterator[tuple[str, Node]]:
            if depth == 0:
                yield node.handle_id, node
                inner = ""
            else:
                yield prefix + ("└─ " if last else "├─ ") + node.segment, node
                inner = prefix + ("   " if last else "│  ")
            for index, child in enumerate(node.children):
                yield from visit(self.nodes[child], inner, index == len(node.children) - 1, depth + 1)

        for top in tops:
            yield from visit(top, "", True, 0)

    def render(self) -> RenderableType:
        elapsed = time.monotonic() - self.started
        states = [state_name(node.state).lower() for node in self.nodes.values()]
        counts = ", ".join(f"{states.count(state)} {state}" for state in ("running", "suspended") if state in states)
        header = Text.assemble(
            (printable(self.runtime_id), "bold"),
            (f"  {elapsed:.1f}s  {len(states)} handle{'s' if len(states) != 1 else ''}", "dim"),
            (f", {counts}" if counts else "", "dim"),
        )
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
        table.add_column("handle", no_wrap=True)
        table.add_column("agent")
        table.add_column("state")
        table.add_column("turns", justify="right")
        table.add_column("own", justify="right")
        table.add_column("total", justify="right")
        table.add_column("cost", justify="right")
        table.add_column("activity")
        for label, node in self.walk():
            state = state_name(node.state)
            table.add_row(
                label,
                node.agent,
                Text(state, STATE_STYLES.get(state, "")),
                str(node.turns),
                str(node.own_tokens),
                str(self.total(node.handle_id)),
                cost_text(node.total_cost),
                Text(printable(self.activity(node))),  # a model's words: no markup, no control
            )
        return Group(header, table)


# What a `reset` delta says, by its reason: the provider call is made again, or the turn runs again.
RESET_MARKERS = {"retry": "[retrying]", "rerun": "[running the turn again]"}


def reset_marker(reset: pb.DeltaReset) -> str:
    return RESET_MARKERS.get(reset.reason, "[starting over]")


class Streamed:
    """The text a handle writes in its model turn under way, for the live view: what came since
    the turn's last reset (and that reset's marker); nothing between turns, when the result
    or the transcript holds the whole reply."""

    def __init__(self) -> None:
        self.handle_id = ""
        self.turn = 0
        self.text = ""
        self.marker = ""

    def apply(self, delta: pb.Delta) -> None:
        if (delta.handle_id, delta.turn) != (self.handle_id, self.turn):
            self.handle_id, self.turn, self.text, self.marker = delta.handle_id, delta.turn, "", ""
        piece = delta.WhichOneof("piece")
        if piece == "text":
            self.text += delta.text
        elif piece == "reset":
            self.text, self.marker = "", reset_marker(delta.reset)

    def end(self, event: pb.Event) -> None:
        """Forgets the turn once its reply is in (its TurnEnded), or the run settled without it."""
        kind = event.WhichOneof("payload")
        ended = kind == "turn_ended" and event.turn_ended.turn == self.turn
        if event.handle_id == self.handle_id and (ended or kind == "result"):
            self.turn, self.text, self.marker = 0, "", ""

    def render(self, console: Console, lines: int) -> RenderableType | None:
        """The turn's last `lines` lines as the console wraps them, under a dim heading."""
        if not self.text and not self.marker:
            return None
        heading = Text(f"{printable(self.handle_id)} turn {self.turn}  {self.marker}".rstrip(), style="dim")
        wrapped = Text(printable(self.text)).wrap(console, console.width)
        return Group(heading, Text("\n").join(wrapped[-lines:]))


def found_agent(handle_id: str) -> str:
    """The agent of a handle id: `explore` for `root/coordinator.1/explore.2`."""
    return handle_id.rsplit("/", 1)[-1].rsplit(".", 1)[0]


def event_line(event: pb.Event) -> str:
    """One line per event, for pipes and `agentruntime watch`."""
    kind = event.WhichOneof("payload")
    head = f"#{event.seq} {event.handle_id}"
    if kind == "spawned":
        return f"{head} spawned agent={event.spawned.agent} parent={event.spawned.parent_id}"
    if kind == "state_changed":
        return f"{head} state {state_name(event.state_changed.state)}"
    if kind == "turn_started":
        return f"{head} turn {event.turn_started.turn} started"
    if kind == "turn_ended":
        ended = event.turn_ended
        calls = f", {ended.tool_calls} tool call{'s' if ended.tool_calls != 1 else ''}" if ended.tool_calls else ""
        return (
            f"{head} turn {ended.turn} ended: {ended.tokens} tokens (own {ended.own_tokens}, total {ended.total_tokens}){calls}"
        )
    if kind == "tool_call_started":
        call = event.tool_call_started.call
        return f"{head} tool {call.name} {call.id} started {short(call.arguments_json, 60)}"
    if kind == "tool_call_ended":
        ended_call = event.tool_call_ended
        error = " (error)" if ended_call.is_error else ""
        return f"{head} tool {ended_call.name} {ended_call.call_id} ended{error}: {short(ended_call.output, 60)}"
    if kind == "pending":
        return f"{head} pending {event.pending.kind} {event.pending.id}: {short(event.pending.prompt, 60)}"
    if kind == "result":
        result = event.result
        limit = f" ({limit_name(result.limit)})" if result.limit else ""
        if result.HasField("failure"):
            limit = f" ({failure_name(result.failure.reason)})"
        return (
            f"{head} result {status_name(result.status)}{limit}: turns {result.turns},"
            f" own tokens {result.own_tokens}, total tokens {result.total_tokens}: {short(result.text, 60)}"
        )
    return f"{head} {kind or 'unknown event'}"


def result_lines(result: pb.TaskResult) -> list[tuple[str, str]]:
    rows = [("handle", result.handle_id), ("status", status_name(result.status))]
    if result.limit:
        rows.append(("limit", limit_name(result.limit)))
    if result.HasField("failure"):
        failure = result.failure
        retry = ", retryable" if failure.retryable else ""
        status = f", HTTP {failure.http_status}" if failure.http_status else ""
        rows.append(("failure", f"{failure_name(failure.reason)} ({failure.provider or 'runtime'}{status}{retry})"))
    rows += [
        ("turns", str(result.turns)),
        ("own tokens", str(result.own_tokens)),
        ("total tokens", str(result.total_tokens)),
        ("total cost", cost_text(result.total_cost)),
        ("tool calls", str(result.tool_calls)),
        ("text", result.text),
    ]
    return rows


def request_lines(request: pb.Request) -> list[tuple[str, str]]:
    rows = [("request", request.id), ("kind", request.kind), ("path", "/".join(request.path))]
    if request.prompt:
        rows.append(("prompt", request.prompt))
    if request.url:
        rows.append(("url", request.url))
    if request.HasField("expires_at"):
        rows.append(("expires", request.expires_at.ToJsonString()))
    for call in request.calls:
        rows.append((f"call {call.id}", f"{call.name} {call.arguments_json}"))
    if not request.calls and request.HasField("data") and request.data.fields:
        rows.append(("data", json.dumps(json_format.MessageToDict(request.data), sort_keys=True)))
    return rows


def handle_lines(view: pb.HandleView) -> list[tuple[str, str]]:
    rows = [
        ("handle", view.handle_id),
        ("parent", view.parent_id),
        ("agent", view.agent),
        ("state", state_name(view.state)),
        ("last status", status_name(view.last_status) if view.last_status else "-"),
        ("turns", str(view.turns)),
        ("own tokens", str(view.own_tokens)),
        ("total tokens", str(view.total_tokens)),
        ("tool calls", str(view.tool_calls)),
        ("inbox", str(view.inbox_size)),
    ]
    if view.pending_kind:
        rows.append(("pending", view.pending_kind))
    if view.HasField("inherited_usage"):  # a fork's handle: what it had spent at the cut
        rows.append(("inherited", f"{view.inherited_usage.total_tokens} tokens, {cost_text(view.inherited_cost)}"))
    budget = json_format.MessageToDict(view.budget, preserving_proto_field_name=True)
    rows.append(("budget", ", ".join(f"{key}={value}" for key, value in budget.items()) or "unlimited"))
    return rows


def key_values(rows: list[tuple[str, str]]) -> str:
    width = max((len(key) for key, _ in rows), default=0)
    lines = []
    for key, value in rows:
        first, *rest = value.splitlines() or [""]
        lines.append(f"{key:<{width}}  {first}".rstrip())
        lines.extend(f"{'':<{width}}  {line}".rstrip() for line in rest)
    return "\n".join(lines)


def columns(headers: list[str], rows: list[list[str]]) -> str:
    """A plain table: columns aligned with two spaces, no borders (pipe-friendly)."""
    widths = [max([len(header)] + [len(row[index]) for row in rows]) for index, header in enumerate(headers)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)
