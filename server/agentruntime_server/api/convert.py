"""The one place protos become domain values and back."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import duration_pb2, json_format, struct_pb2

from ..domain import vocabulary as m
from ..domain.billing.usage import Cost, Tokens, Usage
from ..domain.errors import FieldViolation, InvalidArgument
from ..domain.ports import Dispatch, RuntimeRow
from ..domain.watching.deltas import Delta, DeltaKind
from ..domain.watching.event_log import Event, EventKind
from .values import CONVERTER as VALUES

# google.protobuf.Duration's documented range (about 10,000 years).
MAX_DURATION_SECONDS = 315_576_000_000
MAX_NANOS = 999_999_999


def duration_seconds(message: duration_pb2.Duration, where: str, found: list[FieldViolation]) -> float | None:
    """Seconds, or None (and a violation in `found`) when the Duration is outside its range."""
    seconds, nanos = message.seconds, message.nanos
    if abs(seconds) > MAX_DURATION_SECONDS or abs(nanos) > MAX_NANOS or (seconds > 0 > nanos) or (seconds < 0 < nanos):
        found.append(
            FieldViolation(
                where,
                f"is not a valid Duration: seconds within ±{MAX_DURATION_SECONDS:,}, "
                f"nanos within ±{MAX_NANOS:,} with the same sign",
            )
        )
        return None
    return seconds + nanos / 1e9


def _enum(number: int, enum: type[E], where: str, found: list[FieldViolation], names: str) -> E | None:
    try:
        return enum(number)
    except ValueError:
        found.append(FieldViolation(where, f"{number} is not a known value: use {names}"))
        return None


E = TypeVar("E", bound=enum.Enum)


def struct_to_dict(message: struct_pb2.Struct, where: str, found: list[FieldViolation]) -> dict[str, Any]:
    """A Struct as JSON data; NaN and infinities (which a Struct can hold and JSON cannot) are refused."""
    try:
        return json_format.MessageToDict(message)
    except ValueError:
        found.append(FieldViolation(where, NOT_FINITE))
        return {}


NOT_FINITE = "holds NaN or an infinity: every number must be finite"


def trust_from_proto(number: int, where: str, found: list[FieldViolation]) -> m.Trust:
    if number == pb.TRUST_UNSPECIFIED:
        return m.Trust.HOST
    return _enum(number, m.Trust, where, found, "TRUST_HOST, TRUST_AGENT or TRUST_EXTERNAL") or m.Trust.HOST


def options_from_proto(message: pb.RuntimeOptions) -> m.RuntimeOptions:
    return m.RuntimeOptions(inbox_capacity=message.inbox_capacity, max_concurrent_model_calls=message.max_concurrent_model_calls)


ON_EXHAUSTED_NAMES = "ON_EXHAUSTED_STOP or ON_EXHAUSTED_ASK"


def _opt(message: pb.Budget, name: str) -> int | None:
    return getattr(message, name) if message.HasField(name) else None  # type: ignore[arg-type]


def budget_from_proto(message: pb.Budget, where: str, found: list[FieldViolation]) -> m.Budget:
    wall_time = (
        duration_seconds(message.max_wall_time, f"{where}.max_wall_time", found) if message.HasField("max_wall_time") else None
    )
    return m.Budget(
        max_turns=_opt(message, "max_turns"),
        max_tokens=_opt(message, "max_tokens"),
        max_tool_calls=_opt(message, "max_tool_calls"),
        max_wall_time=wall_time,
        max_children=_opt(message, "max_children"),
        max_depth=_opt(message, "max_depth"),
        max_concurrent=_opt(message, "max_concurrent"),
        max_cost=_opt(message, "max_cost"),
        on_exhausted=_enum(
            message.on_exhausted, m.OnExhausted, f"{where}.on_exhausted", found, "ON_EXHAUSTED_STOP or ON_EXHAUSTED_ASK"
        )
        if message.on_exhausted
        else None,
    )


def budget_to_proto(budget: m.Budget) -> pb.Budget:
    message = pb.Budget()
    for name in ("max_turns", "max_tokens", "max_tool_calls", "max_children", "max_depth", "max_concurrent", "max_cost"):
        value = getattr(budget, name)
        if value is not None:
            setattr(message, name, value)
    if budget.max_wall_time is not None:
        message.max_wall_time.FromNanoseconds(int(budget.max_wall_time * 1e9))
    if budget.on_exhausted is not None:
        message.on_exhausted = budget.on_exhausted.value  # type: ignore[assignment]
    return message


def _tool_from_proto(message: pb.ToolDef, where: str, found: list[FieldViolation]) -> m.ToolSpec:
    executor: m.HttpExecutor | m.WorkerExecutor | m.RelayExecutor = m.RelayExecutor()
    kind = message.WhichOneof("executor")
    if kind == "http":
        http = message.http
        timeout = duration_seconds(http.timeout, f"{where}.http.timeout", found) if http.HasField("timeout") else None
        executor = m.HttpExecutor(url=http.url, headers=dict(http.headers), timeout=30.0 if timeout is None else timeout)
    elif kind == "worker":
        worker = message.worker
        timeout = duration_seconds(worker.timeout, f"{where}.worker.timeout", found) if worker.HasField("timeout") else None
        executor = m.WorkerExecutor(queue=worker.queue, timeout=30.0 if timeout is None else timeout)
    elif kind is None:
        found.append(
            FieldViolation(f"{where}.executor", "say who runs the tool: set relay (the host), http or worker (a ServeTools host)")
        )
    on_interrupted = _enum(
        message.on_interrupted, m.OnInterrupted, f"{where}.on_interrupted", found, "ON_INTERRUPTED_RETRY or ON_INTERRUPTED_ASK"
    )
    return m.ToolSpec(
        name=message.name,
        description=message.description,
        input_schema=struct_to_dict(message.input_schema, f"{where}.input_schema", found),
        executor=executor,
        approval_required=message.approval.required,
        approval_prompt=message.approval.prompt,
        on_interrupted=on_interrupted or m.OnInterrupted.DEFAULT,
    )


def agents_from_proto(messages: Sequence[pb.AgentDef]) -> tuple[tuple[m.AgentSpec, ...], list[FieldViolation]]:
    """The definitions, and what decoding found wrong (reported with the domain's checks)."""
    found: list[FieldViolation] = []
    agents = tuple(_agent_from_proto(message, f"agents[{index}]", found) for index, message in enumerate(messages))
    return agents, found


def _guardrail(message: pb.Guardrail, where: str, found: list[FieldViolation]) -> m.Guardrail:
    action = None
    if message.action == pb.GUARDRAIL_ACTION_UNSPECIFIED:
        found.append(FieldViolation(f"{where}.action", "set GUARDRAIL_ACTION_DENY or GUARDRAIL_ACTION_REQUIRE_APPROVAL"))
    else:
        action = _enum(
            message.action,
            m.GuardrailAction,
            f"{where}.action",
            found,
            "GUARDRAIL_ACTION_DENY or GUARDRAIL_ACTION_REQUIRE_APPROVAL",
        )
    return m.Guardrail(tool=message.tool, action=action or m.GuardrailAction.DENY, reason=message.reason)


def _reply(message: pb.ScriptedReply, where: str, found: list[FieldViolation]) -> m.ScriptedReply:
    delay = duration_seconds(message.delay, f"{where}.delay", found) if message.HasField("delay") else 0.0
    pause = duration_seconds(message.stream_pause, f"{where}.stream_pause", found) if message.HasField("stream_pause") else 0.0
    names = "SCRIPTED_STOP_MAX_OUTPUT_TOKENS, SCRIPTED_STOP_REFUSAL or SCRIPTED_STOP_PROVIDER_UNAVAILABLE"
    stop = _enum(message.stop, m.ReplyStop, f"{where}.stop", found, names)
    return m.ScriptedReply(
        text=message.text,
        tool_calls=tuple(m.ScriptedToolCall(c.name, c.arguments_json) for c in message.tool_calls),
        tokens=message.tokens,
        delay=delay or 0.0,
        stop=stop or m.ReplyStop.COMPLETE,
        usage=tokens_from_proto(message.usage) if message.HasField("usage") else None,
        stream_chunk_chars=message.stream_chunk_chars,
        stream_pause=pause or 0.0,
    )


def tokens_from_proto(message: pb.Usage) -> Tokens:
    return Tokens(
        message.input_tokens,
        message.cache_read_tokens,
        message.cache_write_tokens,
        message.output_tokens,
        message.reasoning_tokens,
    )


def _agent_from_proto(message: pb.AgentDef, where: str, found: list[FieldViolation]) -> m.AgentSpec:
    return m.AgentSpec(
        name=message.name,
        description=message.description,
        instructions=message.instructions,
        model=message.model,
        tools=tuple(_tool_from_proto(tool, f"{where}.tools[{i}]", found) for i, tool in enumerate(message.tools)),
        team=tuple(message.team),
        budget=budget_from_proto(message.budget, f"{where}.budget", found),
        completion=m.CompletionGate(
            max_attempts=message.completion.max_attempts,
            must_match=message.completion.must_match,
            judge_agent=message.completion.judge_agent,
        ),
        guardrails=tuple(_guardrail(rail, f"{where}.guardrails[{i}]", found) for i, rail in enumerate(message.guardrails)),
        script=tuple(_reply(reply, f"{where}.script.replies[{i}]", found) for i, reply in enumerate(message.script.replies)),
        provider=message.provider,
        max_output_tokens=message.max_output_tokens if message.HasField("max_output_tokens") else None,
        output_schema=struct_to_dict(message.output_schema, f"{where}.output_schema", found)
        if message.HasField("output_schema")
        else None,
        heartbeat=_heartbeat(message, where, found),
        compaction=m.Compaction(
            max_context_tokens=message.compaction.max_context_tokens,
            keep_last_turns=message.compaction.keep_last_turns,
            summarizer_agent=message.compaction.summarizer_agent,
        )
        if message.HasField("compaction")
        else None,
        mcp_servers=tuple(
            _mcp_server(server, f"{where}.mcp_servers[{i}]", found) for i, server in enumerate(message.mcp_servers)
        ),
        prompt_cache=message.prompt_cache,
    )


def _mcp_server(message: pb.McpServer, where: str, found: list[FieldViolation]) -> m.McpServerSpec:
    timeout = duration_seconds(message.timeout, f"{where}.timeout", found) if message.HasField("timeout") else None
    return m.McpServerSpec(
        name=message.name,
        url=message.url,
        headers=dict(message.headers),
        allowed_tools=tuple(message.allowed_tools),
        timeout=30.0 if timeout is None else timeout,
    )


def _heartbeat(message: pb.AgentDef, where: str, found: list[FieldViolation]) -> m.Heartbeat | None:
    if not message.HasField("heartbeat"):
        return None
    beat = message.heartbeat
    every = duration_seconds(beat.every, f"{where}.heartbeat.every", found) if beat.HasField("every") else 0.0
    return m.Heartbeat(every=every or 0.0, prompt=beat.prompt or "heartbeat")


def _tool_call_to_proto(call: m.ToolCall, idempotency_key: str = "") -> pb.ToolCall:
    return pb.ToolCall(id=call.id, name=call.name, arguments_json=call.arguments_json, idempotency_key=idempotency_key)


def request_to_proto(request: m.PendingRequest) -> pb.Request:
    message = pb.Request(
        id=request.id,
        kind=request.kind,
        prompt=request.prompt,
        url=request.url,
        path=list(request.path),
        calls=[_tool_call_to_proto(call, key) for call, key in request.calls],
    )
    if request.data:
        message.data.update(request.data)
    if request.expires_at is not None:
        message.expires_at.FromNanoseconds(int(request.expires_at * 1e9))
    return message


def with_usage(message: Counted, usage: Usage) -> Counted:
    """The counters every reply carries (TaskResult, HandleView), named as in the proto."""
    message.turns = usage.turns
    message.own_tokens = usage.own_tokens
    message.total_tokens = usage.total_tokens
    message.tool_calls = usage.tool_calls
    message.own_usage.CopyFrom(usage_to_proto(usage.own_split, usage.own_estimated))
    message.total_usage.CopyFrom(usage_to_proto(usage.total_split, usage.total_estimated))
    message.own_cost.CopyFrom(cost_to_proto(usage.own_cost))
    message.total_cost.CopyFrom(cost_to_proto(usage.total_cost))
    return message


def with_inherited(message: Counted, inherited: Usage | None) -> Counted:
    """A fork's figures at its cut: set only in a fork."""
    if inherited is not None:
        message.inherited_usage.CopyFrom(usage_to_proto(inherited.total_split, inherited.total_estimated))
        message.inherited_cost.CopyFrom(cost_to_proto(inherited.total_cost))
    return message


def usage_to_proto(tokens: Tokens, estimated: bool = False) -> pb.Usage:
    return pb.Usage(
        input_tokens=tokens.input,
        cache_read_tokens=tokens.cache_read,
        cache_write_tokens=tokens.cache_write,
        output_tokens=tokens.output,
        reasoning_tokens=tokens.reasoning,
        total_tokens=tokens.total,
        estimated=estimated,
    )


def cost_to_proto(cost: Cost) -> pb.Cost:
    return pb.Cost(micros=cost.micros, currency=cost.currency, priced=cost.priced)


Counted = TypeVar("Counted", pb.TaskResult, pb.HandleView)


async def prepare_output(result: m.TaskResult) -> None:
    """A large typed output is converted off the event loop before result_to_proto reads it."""
    if result.output is not None:
        await VALUES.prepare(result.output, len(result.text), f"the typed output of {result.handle_id}")


def result_to_proto(result: m.TaskResult) -> pb.TaskResult:
    message = pb.TaskResult(
        handle_id=result.handle_id,
        text=result.text,
        is_error=result.is_error,
        status=result.status.value,  # type: ignore[arg-type]
        limit=result.limit.value,  # type: ignore[arg-type]
    )
    with_usage(message, result.usage)
    with_inherited(message, result.inherited)
    if result.failure is not None:
        failure = result.failure
        message.failure.CopyFrom(
            pb.Failure(
                reason=failure.reason.value,  # type: ignore[arg-type]
                provider=failure.provider,
                http_status=failure.http_status,
                retryable=failure.retryable,
                detail=failure.detail,
            )
        )
    if result.pending is not None:
        message.pending.CopyFrom(request_to_proto(result.pending))
    if result.output is not None:
        VALUES.copy(result.output, message.output, f"the typed output of {result.handle_id}")
    return message


def handle_to_proto(snapshot: m.HandleSnapshot) -> pb.HandleView:
    view = pb.HandleView(
        handle_id=snapshot.handle_id,
        parent_id=snapshot.parent_id,
        agent=snapshot.agent,
        state=snapshot.state.value,  # type: ignore[arg-type]
        pending_kind=snapshot.pending_kind,
        inbox_size=snapshot.inbox_size,
        budget=budget_to_proto(snapshot.budget),
        last_status=snapshot.last_status.value,  # type: ignore[arg-type]
    )
    return with_inherited(with_usage(view, snapshot.usage), snapshot.inherited)


def message_to_proto(message: m.Message) -> pb.Message:
    return pb.Message(
        role=message.role,
        content=message.content,
        tool_calls=[_tool_call_to_proto(call) for call in message.tool_calls],
        tool_call_id=message.tool_call_id,
        is_error=message.is_error,
        turn=message.turn,
        refusal=message.refusal,
        truncated=message.truncated,
        trust=message.trust.value if message.role == "user" else pb.TRUST_UNSPECIFIED,  # type: ignore[arg-type]
        summary=message.summary,
        thinking=[pb.Thinking(text=t.text, signature=t.signature, redacted_data=t.redacted_data) for t in message.thinking],
    )


def answer_from_proto(message: pb.Answer) -> m.Answer:
    """InvalidArgument naming each part JSON cannot carry (`data`, an output's `structured`)."""
    found: list[FieldViolation] = []
    data = struct_to_dict(message.data, "answer.data", found)
    outputs = tuple(
        m.ToolOutput(o.call_id, tool_output_text(o, f"answer.outputs[{index}].structured", found), o.is_error)
        for index, o in enumerate(message.outputs)
    )
    if found:
        raise InvalidArgument(found)
    return m.Answer(id=message.id, ok=message.ok, data=data, reason=message.reason, outputs=outputs)


def tool_output_text(output: pb.ToolOutput, where: str, found: list[FieldViolation]) -> str:
    """What the model reads of a tool's output: its `structured` value as JSON text when it has
    one, else its `output`. A `structured` holding NaN or an infinity (a Value can, JSON cannot)
    is a violation at `where`, added to `found` (and '' returned)."""
    if not output.HasField("structured"):
        return output.output
    try:
        value = json_format.MessageToDict(output.structured)
    except ValueError:
        found.append(FieldViolation(where, NOT_FINITE))
        return ""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def runtime_summary(row: RuntimeRow) -> pb.RuntimeSummary:
    figures = row.counts
    summary = pb.RuntimeSummary(
        runtime_id=row.runtime_id.rpartition(":")[2],
        handle_count=figures.handles,
        running_count=figures.running,
        suspended_count=figures.suspended,
        total_tokens=figures.tokens,
        total_cost=pb.Cost(micros=figures.cost_micros, currency=figures.cost_currency, priced=figures.cost_priced),
        forked_from=row.forked_from,
        fork_seq=row.fork_seq,
    )
    summary.create_time.FromNanoseconds(int(row.created_at * 1e9))
    return summary


def delta_to_proto(delta: Delta) -> pb.Delta:
    message = pb.Delta(handle_id=delta.handle_id, turn=delta.turn, index=delta.index, after_seq=delta.after_seq)
    kind = delta.kind
    if kind is DeltaKind.TEXT:
        message.text = delta.text
    elif kind is DeltaKind.THINKING:
        message.thinking = delta.text
    elif kind is DeltaKind.TOOL_CALL:
        message.tool_call.CopyFrom(pb.ToolCallDelta(index=delta.call_index, name=delta.name, arguments=delta.text))
    else:
        message.reset.CopyFrom(pb.DeltaReset(reason=delta.text))
    return message


def event_to_proto(event: Event) -> pb.Event:
    message = pb.Event(seq=event.seq, handle_id=event.handle_id)
    message.time.FromNanoseconds(int(event.time * 1e9))
    kind = event.kind
    if kind is EventKind.SPAWNED:
        message.spawned.CopyFrom(pb.HandleSpawned(parent_id=event.parent_id, agent=event.agent))
    elif kind is EventKind.STATE_CHANGED and event.state is not None:
        message.state_changed.CopyFrom(pb.StateChanged(state=event.state.value))  # type: ignore[arg-type]
    elif kind is EventKind.TURN_STARTED:
        message.turn_started.CopyFrom(pb.TurnStarted(turn=event.turn))
    elif kind is EventKind.TURN_ENDED:
        message.turn_ended.CopyFrom(
            pb.TurnEnded(
                turn=event.turn,
                tokens=event.tokens,
                own_tokens=event.own_tokens,
                total_tokens=event.total_tokens,
                tool_calls=event.tool_calls,
                usage_estimated=event.usage_estimated,
            )
        )
        turn = message.turn_ended
        if event.split is not None:
            turn.usage.CopyFrom(usage_to_proto(event.split, event.usage_estimated))
        if event.cost is not None:
            turn.cost.CopyFrom(cost_to_proto(event.cost))
        if event.usage is not None:
            turn.own_usage.CopyFrom(usage_to_proto(event.usage.own_split, event.usage.own_estimated))
            turn.total_usage.CopyFrom(usage_to_proto(event.usage.total_split, event.usage.total_estimated))
            turn.own_cost.CopyFrom(cost_to_proto(event.usage.own_cost))
            turn.total_cost.CopyFrom(cost_to_proto(event.usage.total_cost))
    elif kind is EventKind.TOOL_CALL_STARTED and event.call is not None:
        message.tool_call_started.CopyFrom(pb.ToolCallStarted(call=_tool_call_to_proto(event.call)))
    elif kind is EventKind.TOOL_CALL_ENDED:
        message.tool_call_ended.CopyFrom(
            pb.ToolCallEnded(
                call_id=event.call_id,
                name=event.call.name if event.call else "",
                is_error=event.is_error,
                output=event.output,
            )
        )
    elif kind is EventKind.PENDING and event.pending is not None:
        message.pending.CopyFrom(request_to_proto(event.pending))
    elif kind is EventKind.RESULT and event.result is not None:
        message.result.CopyFrom(result_to_proto(event.result))
    return message


def worker_call_to_proto(dispatch: Dispatch) -> pb.WorkerCall:
    message = pb.WorkerCall(
        id=dispatch.id,
        call=_tool_call_to_proto(dispatch.call, dispatch.key),
        runtime_id=dispatch.runtime_id,
        handle_id=dispatch.handle_id,
    )
    message.deadline.FromNanoseconds(int(dispatch.deadline * 1e9))
    return message
