"""The one place protos become domain values and back."""

from __future__ import annotations

from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import json_format

from ..domain import model as m
from ..domain.errors import FieldViolation, InvalidArgument
from ..domain.events import Event, EventKind


def _opt(message: pb.Budget, name: str) -> int | None:
    return getattr(message, name) if message.HasField(name) else None  # type: ignore[arg-type]


def budget_from_proto(message: pb.Budget) -> m.Budget:
    return m.Budget(
        max_turns=_opt(message, "max_turns"),
        max_tokens=_opt(message, "max_tokens"),
        max_tool_calls=_opt(message, "max_tool_calls"),
        max_wall_time=message.max_wall_time.ToTimedelta().total_seconds() if message.HasField("max_wall_time") else None,
        max_children=_opt(message, "max_children"),
        max_depth=_opt(message, "max_depth"),
        max_concurrent=_opt(message, "max_concurrent"),
    )


def budget_to_proto(budget: m.Budget) -> pb.Budget:
    message = pb.Budget()
    for name in ("max_turns", "max_tokens", "max_tool_calls", "max_children", "max_depth", "max_concurrent"):
        value = getattr(budget, name)
        if value is not None:
            setattr(message, name, value)
    if budget.max_wall_time is not None:
        message.max_wall_time.FromNanoseconds(int(budget.max_wall_time * 1e9))
    return message


def _tool_from_proto(message: pb.ToolDef) -> m.ToolSpec:
    executor: m.HttpExecutor | m.RelayExecutor
    if message.WhichOneof("executor") == "http":
        http = message.http
        timeout = http.timeout.ToTimedelta().total_seconds() if http.HasField("timeout") else 30.0
        executor = m.HttpExecutor(url=http.url, headers=dict(http.headers), timeout=timeout)
    else:
        executor = m.RelayExecutor()
    return m.ToolSpec(
        name=message.name,
        description=message.description,
        input_schema=json_format.MessageToDict(message.input_schema),
        executor=executor,
        approval_required=message.approval.required,
        approval_prompt=message.approval.prompt,
        on_interrupted=m.OnInterrupted(message.on_interrupted),
    )


def agents_from_proto(messages: list[pb.AgentDef]) -> tuple[m.AgentSpec, ...]:
    unspecified = [
        FieldViolation(f"agents[{i}].guardrails[{j}].action", "set GUARDRAIL_ACTION_DENY or GUARDRAIL_ACTION_REQUIRE_APPROVAL")
        for i, agent in enumerate(messages)
        for j, rail in enumerate(agent.guardrails)
        if rail.action == pb.GUARDRAIL_ACTION_UNSPECIFIED
    ]
    if unspecified:
        raise InvalidArgument(unspecified)
    return tuple(agent_from_proto(message) for message in messages)


def agent_from_proto(message: pb.AgentDef) -> m.AgentSpec:
    return m.AgentSpec(
        name=message.name,
        description=message.description,
        instructions=message.instructions,
        model=message.model,
        tools=tuple(_tool_from_proto(tool) for tool in message.tools),
        team=tuple(message.team),
        budget=budget_from_proto(message.budget),
        completion=m.CompletionGate(
            max_attempts=message.completion.max_attempts,
            must_match=message.completion.must_match,
            judge_agent=message.completion.judge_agent,
        ),
        guardrails=tuple(
            m.Guardrail(tool=rail.tool, action=m.GuardrailAction(rail.action), reason=rail.reason) for rail in message.guardrails
        ),
        script=tuple(
            m.ScriptedReply(
                text=reply.text,
                tool_calls=tuple(m.ScriptedToolCall(c.name, c.arguments_json) for c in reply.tool_calls),
                tokens=reply.tokens,
                delay=reply.delay.ToTimedelta().total_seconds(),
            )
            for reply in message.script.replies
        ),
        provider=message.provider,
    )


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
    return message


def result_to_proto(result: m.TaskResult) -> pb.TaskResult:
    message = pb.TaskResult(
        handle_id=result.handle_id,
        text=result.text,
        is_error=result.is_error,
        status=result.status.value,  # type: ignore[arg-type]
        limit=result.limit.value,  # type: ignore[arg-type]
        turns=result.turns,
        total_tokens=result.total_tokens,
        own_tokens=result.own_tokens,
        tool_calls=result.tool_calls,
    )
    if result.pending is not None:
        message.pending.CopyFrom(request_to_proto(result.pending))
    return message


def handle_to_proto(snapshot: m.HandleSnapshot) -> pb.HandleView:
    return pb.HandleView(
        handle_id=snapshot.handle_id,
        parent_id=snapshot.parent_id,
        agent=snapshot.agent,
        state=snapshot.state.value,  # type: ignore[arg-type]
        turns=snapshot.turns,
        total_tokens=snapshot.total_tokens,
        own_tokens=snapshot.own_tokens,
        pending_kind=snapshot.pending_kind,
        inbox_size=snapshot.inbox_size,
        tool_calls=snapshot.tool_calls,
        budget=budget_to_proto(snapshot.budget),
        last_status=snapshot.last_status.value,  # type: ignore[arg-type]
    )


def message_to_proto(message: m.Message) -> pb.Message:
    return pb.Message(
        role=message.role,
        content=message.content,
        tool_calls=[_tool_call_to_proto(call) for call in message.tool_calls],
        tool_call_id=message.tool_call_id,
        is_error=message.is_error,
        turn=message.turn,
    )


def answer_from_proto(message: pb.Answer) -> m.Answer:
    return m.Answer(
        id=message.id,
        ok=message.ok,
        data=json_format.MessageToDict(message.data),
        reason=message.reason,
        outputs=tuple(m.ToolOutput(o.call_id, o.output, o.is_error) for o in message.outputs),
    )


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
            )
        )
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
