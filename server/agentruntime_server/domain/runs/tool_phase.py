"""A turn's tool phase: the calls of the model's last reply run (or suspend on a Request to
the host), each journaled as started before it runs and as finished when it answers, so a
phase re-entered after a Resume or a restart runs only what has no result yet."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from ..definitions import schemas
from ..definitions.schema_checks import schema_problem
from ..errors import shown
from ..journal import CallFinished, CallStarted, CallSuspended, InDoubt, MessagesAppended
from ..journal.handle import Handle
from ..journal.recording import Recording
from ..ports import CallInDoubt, CallNotSent, StructuredContent, WorkerLost
from ..suspension.requests import budget_request, idempotency_key, own_request, tool_request
from ..tenancy.quotas import RunningSlot
from ..vocabulary import (
    GuardrailAction,
    HttpExecutor,
    Limit,
    McpExecutor,
    Message,
    PendingRequest,
    RelayExecutor,
    Status,
    ToolCall,
    ToolResult,
    ToolSpec,
    ToolSuspension,
    UnrecordedCalls,
    WorkerExecutor,
)
from . import budgets, prompts
from .delegation import run_child
from .driver import Run, RunHost

EFFECTS = (HttpExecutor, WorkerExecutor, McpExecutor)  # calls that run outside the process
WORKER_ATTEMPTS = 3  # workers a call is given to, when each goes away with it, before it fails
# Seconds before each resend of an http call in doubt under RETRY (three attempts in all): a
# tool server that died with the call is given a moment to come back.
HTTP_RETRY_PAUSES = (1.0, 2.0)


class ToolPhase:
    def __init__(self, host: RunHost) -> None:
        self.host = host
        self.services = host.services
        self._validators: dict[tuple[str, str], schemas.ArgumentsSchema] = {}

    async def run(self, handle: Handle, run: Run, message: Message) -> Limit | PendingRequest | None:
        """Runs what can run now; returns the Request to suspend on, a limit, or None when done."""
        fresh = [call for call in message.tool_calls if call.id not in handle.tool_results]
        # A call counts against the budgets from when it starts: one under way already (a task
        # call whose child runs or waits, a call started before a restart) has its place.
        allowed = budgets.tool_calls_left(handle)
        runnable: list[ToolCall] = []
        refused: list[ToolCall] = []
        for call in fresh:
            if call.id in handle.calls_out or allowed is None:
                runnable.append(call)
            elif allowed > 0:
                runnable.append(call)
                allowed -= 1
            else:
                refused.append(call)
        now: list[tuple[ToolCall, ToolResult | HttpExecutor | WorkerExecutor | McpExecutor | dict[str, Any]]] = []
        relay: list[ToolCall] = []
        held: list[PendingRequest] = []  # approvals and questions, one Request each
        starts: list[CallStarted] = []
        replaying = self.host.tree.replaying
        for call in runnable:
            if replaying is not None and call.name != "task" and call.id not in handle.calls_out:
                answered = _replayed(replaying, handle, call)
                if isinstance(answered, ToolResult):
                    now.append((call, answered))
                    starts.append(CallStarted(handle.id, call))
                    continue
                if answered is UnrecordedCalls.HOST:
                    relay.append(call)
                    starts.append(CallStarted(handle.id, call, announce=False))
                    continue
            kind = self._suspension_kind(handle, call)
            arguments = None
            if kind in ("approval", "relay"):
                # Arguments a tool would refuse never reach the host or a person: the call is an
                # error result for the model now (_prepare gives it), as for a tool that runs here.
                arguments = await self._arguments(handle, call)
                if isinstance(arguments, ToolResult):
                    kind = ""
            if kind == "relay":
                relay.append(call)
            elif kind:
                held.append(self._ask(handle, kind, [call]))
            else:
                prepared = await self._prepare(handle, call, arguments)
                now.append((call, prepared))
                if call.id not in handle.children_by_key:  # a task call started long ago is not started again
                    effect = isinstance(prepared, (HttpExecutor, WorkerExecutor, McpExecutor))
                    starts.append(CallStarted(handle.id, call, effect=effect))
            if kind in ("relay", "input") and call.id not in handle.calls_out:
                # Out to the host: its answer is the result, so the call counts from now.
                starts.append(CallStarted(handle.id, call, announce=False))
        slot = run.slot
        if slot is not None and any(isinstance(prepared, EFFECTS) for _, prepared in now):
            # Its own calls are work: a running slot first (before they are journaled as started,
            # so none is in doubt for having waited for one).
            await slot.hold()
        if starts:
            # Journaled together, before any call runs: the budgets of the lineage count every
            # call let through at once (no sibling's phase can slip in between).
            await self.host.journal.record(*starts)
        if len(now) == 1:  # the common case needs no task of its own
            child_requests = [await self._call(handle, run, *now[0])]
        else:
            lent = slot if now else None
            if lent is not None:
                lent.join(len(now))  # the calls work now; the loop only waits for them
                lent.leave()
            tasks = [asyncio.ensure_future(self._call(handle, run, *call)) for call in now]
            if lent is not None:
                # Each call is one of its run's activities until its task is done: a done
                # callback, which runs for a task cancelled before its first step too (a
                # coroutine wrapped around the call would never run then, and never leave).
                leave = _leaver(lent)
                for task in tasks:
                    task.add_done_callback(leave)
            try:
                child_requests = await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:  # one call failed (or the run stops): none outlives the run
                    task.cancel()
                raise
            finally:
                if lent is not None:
                    lent.join()  # the loop goes on (a slot is taken back before its next work)
        own = ([self._ask(handle, "tool_call", relay)] if relay else []) + held
        waiting = own + [request for request in child_requests if request is not None]
        if waiting:
            return waiting[0]
        if refused and budgets.binding_tool_calls(handle) is handle and handle.budget.asks:
            return budget_request(handle, Limit.MAX_TOOL_CALLS)  # the refused calls run once it is extended
        refusal = ToolResult(f"not run: the tool call budget is used up ({Limit.MAX_TOOL_CALLS.wire_name})", is_error=True)
        results = [handle.tool_results.get(call.id) or refusal for call in message.tool_calls]
        await self.host.journal.record(
            MessagesAppended(
                handle.id,
                tuple(
                    Message(role="tool", content=result.output, tool_call_id=call.id, is_error=result.is_error)
                    for call, result in zip(message.tool_calls, results, strict=True)
                ),
            )
        )
        return Limit.MAX_TOOL_CALLS if refused else None

    def _suspension_kind(self, handle: Handle, call: ToolCall) -> str:
        """Why this call needs the host before it can complete ('' when it can run now)."""
        agent = handle.agent
        rail = agent.guardrail(call.name)
        if rail is not None and rail.action is GuardrailAction.DENY:
            return ""
        if call.id in handle.in_doubt:
            return "in_doubt"
        if call.name == "ask":
            return "input"
        spec = agent.tool(call.name)
        needs_approval = (spec is not None and spec.approval_required) or (
            rail is not None and rail.action is GuardrailAction.REQUIRE_APPROVAL
        )
        if needs_approval and call.id not in handle.approved:
            return "approval"
        if spec is not None and isinstance(spec.executor, RelayExecutor):
            return "relay"
        return ""

    def _ask(self, handle: Handle, kind: str, calls: list[ToolCall]) -> PendingRequest:
        return own_request(self.host.key, self.host.tree.answered, handle, kind, calls)

    async def _call(
        self,
        handle: Handle,
        run: Run,
        call: ToolCall,
        prepared: ToolResult | HttpExecutor | WorkerExecutor | McpExecutor | dict[str, Any],
    ) -> PendingRequest | None:
        """Runs one call (its start is journaled by the tool phase) and journals its result;
        a suspended child's Request is returned instead of a result."""
        effect = isinstance(prepared, (HttpExecutor, WorkerExecutor, McpExecutor))
        result: ToolResult | PendingRequest
        if isinstance(prepared, ToolResult):
            result = prepared
        elif isinstance(prepared, WorkerExecutor):
            await self.services.store.flush(self.host.key)  # the call leaves the process next
            result = await self._on_worker(handle, call, prepared)
        elif isinstance(prepared, McpExecutor):
            await self.services.store.flush(self.host.key)
            arguments = json.loads(call.arguments_json)  # checked by _prepare: a JSON object
            reply = await self.services.mcp.call(prepared, arguments, idempotency_key(self.host.key, handle, call))
            result = await self._structured(handle, call, prepared, reply) if isinstance(reply, StructuredContent) else reply
        elif effect:
            assert isinstance(prepared, HttpExecutor)
            await self.services.store.flush(self.host.key)  # the call leaves the process next: it must be known to have started
            result = await self._on_http(handle, call, prepared)
        else:
            assert isinstance(prepared, dict)
            result = await self._delegate(handle, run, call, prepared)
        if isinstance(result, PendingRequest):
            return result
        await self.record(handle, call, result)
        return None

    async def _on_http(self, handle: Handle, call: ToolCall, executor: HttpExecutor) -> ToolResult | PendingRequest:
        """An http tool's output, or the Request it suspends on. An attempt cut off once its
        request was sent leaves the call in doubt, as a crash does: ASK suspends on an
        `in_doubt` Request; RETRY sends it again with the same key after a pause, twice at most.
        A call in doubt stays in doubt: a later attempt that reaches nothing answers nothing."""
        key = idempotency_key(self.host.key, handle, call)
        causes: list[str] = []  # why each attempt got no answer, once the call is in doubt
        for pause in (0.0, *HTTP_RETRY_PAUSES):
            if pause:
                await self.services.clock.sleep(pause)
            try:
                outcome = await self.services.http_tools.run(executor, call.arguments_json, key, handle.tool_answers.get(call.id))
            except CallNotSent as error:
                if not causes:
                    return ToolResult(str(error), is_error=True)
                causes.append(str(error))
                continue
            except CallInDoubt as error:
                causes.append(str(error))
                spec = handle.agent.tool(call.name)
                if spec is not None and spec.asks_when_in_doubt:
                    await self.host.journal.record(InDoubt(handle.id, (call.id,)))
                    return self._ask(handle, "in_doubt", [call])
                continue
            if isinstance(outcome, ToolSuspension):
                await self.host.journal.record(CallSuspended(handle.id, call.id))
                return tool_request(self.host.key, handle, call, outcome)
            return outcome
        said = "; ".join(dict.fromkeys(causes))
        return ToolResult(
            f"no answer in {len(causes)} attempts with the same Idempotency-Key ({said}): "
            "the call may or may not have taken effect",
            is_error=True,
        )

    async def _on_worker(self, handle: Handle, call: ToolCall, executor: WorkerExecutor) -> ToolResult | PendingRequest:
        """A worker's output. A worker lost with the call in hand leaves it in doubt: ASK
        suspends on an `in_doubt` Request; otherwise another worker runs it, with the same key."""
        key = idempotency_key(self.host.key, handle, call)
        lost: list[str] = []  # the workers that took it and did not answer: it is in doubt from then on
        for _ in range(WORKER_ATTEMPTS):
            try:
                return await self.services.workers.run(
                    self.host.tenant, executor, call, key, self.host.id, handle.id, lost=tuple(lost)
                )
            except WorkerLost as error:
                if error.worker_id and error.worker_id not in lost:
                    lost.append(error.worker_id)
                spec = handle.agent.tool(call.name)
                if spec is not None and spec.asks_when_in_doubt:
                    await self.host.journal.record(InDoubt(handle.id, (call.id,)))
                    return self._ask(handle, "in_doubt", [call])
        return ToolResult(
            f"{WORKER_ATTEMPTS} workers took the call and none answered: it may or may not have taken effect", is_error=True
        )

    async def record(self, handle: Handle, call: ToolCall, result: ToolResult) -> None:
        """Journals a call's result (once: a call already recorded keeps its first result)."""
        if call.id not in handle.tool_results:
            await self.host.journal.record(CallFinished(handle.id, call, result))

    async def _schema_problem(self, handle: Handle, spec: ToolSpec, arguments: dict[str, Any], text: str) -> str | None:
        """Why the arguments fail the tool's schema (compiled once per tool), or None."""
        key = (handle.agent.name, spec.name)
        validator = self._validators.get(key)
        if validator is None:
            validator = self._validators[key] = schemas.compiled(spec.input_schema)
        try:
            problem = await schema_problem(self.services.schema_judge, self.host.tenant, validator, arguments, text)
        except schemas.CheckNotDone as exc:
            return f"the schema could not be applied: {shown(str(exc), 200)}"
        except schemas.VALIDATION_FAULTS as exc:
            return f"the schema could not be applied ({type(exc).__name__})"
        return None if problem is None else shown(problem, 300)

    async def _structured(self, handle: Handle, call: ToolCall, executor: McpExecutor, content: StructuredContent) -> ToolResult:
        """An MCP tool's structured content as the model reads it, once it matches the output
        schema the tool listed (compiled once per tool); an error result when it does not."""
        assert executor.output_schema is not None
        key = (handle.agent.name, f"{call.name} output")
        validator = self._validators.get(key)
        if validator is None:
            validator = self._validators[key] = schemas.ArgumentsSchema(executor.output_schema)
        try:
            problem = await schema_problem(self.services.schema_judge, self.host.tenant, validator, content.value, content.text)
        except schemas.CheckNotDone as exc:
            problem = f"its output schema could not be applied: {shown(str(exc), 200)}"
        except schemas.VALIDATION_FAULTS as exc:
            problem = f"its output schema could not be applied ({type(exc).__name__})"
        else:
            if problem is not None:
                problem = f"its structured content does not match its output schema: {shown(problem, 300)}"
        if problem is not None:
            return ToolResult(f"MCP server {content.server!r}: {problem}", is_error=True)
        return ToolResult(content.text)

    async def _prepare(
        self, handle: Handle, call: ToolCall, arguments: dict[str, Any] | ToolResult | None = None
    ) -> ToolResult | HttpExecutor | WorkerExecutor | McpExecutor | dict[str, Any]:
        """What running the call takes: an error result now, the http tool to call, or the
        task arguments to delegate with (`arguments`: what _arguments said already, if asked)."""
        agent = handle.agent
        rail = agent.guardrail(call.name)
        if rail is not None and rail.action is GuardrailAction.DENY:
            return ToolResult(f"denied by guardrail: {rail.reason or 'this tool is not allowed'}", is_error=True)
        if arguments is None:
            arguments = await self._arguments(handle, call)
        if isinstance(arguments, ToolResult) or (call.name == "task" and agent.team):
            return arguments
        spec = agent.tool(call.name)
        assert spec is not None  # _arguments refuses an unknown tool
        assert not isinstance(spec.executor, RelayExecutor)  # valid relay calls suspend before they get here
        return spec.executor

    async def _arguments(self, handle: Handle, call: ToolCall) -> dict[str, Any] | ToolResult:
        """The call's arguments, or the error result that refuses them (not JSON, not an object,
        an unknown tool, or not what the tool's input_schema asks for)."""
        agent = handle.agent
        try:
            arguments = json.loads(call.arguments_json)
        except (ValueError, RecursionError) as exc:
            return ToolResult(f"the arguments are not valid JSON: {shown(str(exc), 200)}", is_error=True)
        if not isinstance(arguments, dict):
            return ToolResult("the arguments must be a JSON object", is_error=True)
        if call.name == "task" and agent.team:
            return arguments
        spec = agent.tool(call.name)
        if spec is None:
            known = sorted([tool.name for tool in agent.tools] + ["ask"] + (["task"] if agent.team else []))
            return ToolResult(f"unknown tool {call.name!r}; available tools: {known}", is_error=True)
        if spec.input_schema:
            problem = await self._schema_problem(handle, spec, arguments, call.arguments_json)
            if problem is not None:
                return ToolResult(f"the arguments do not match the tool's schema: {problem}", is_error=True)
        return arguments

    # ---- delegation ------------------------------------------------------------------------

    async def _delegate(self, handle: Handle, run: Run, call: ToolCall, arguments: dict[str, Any]) -> ToolResult | PendingRequest:
        name, prompt = arguments.get("agent"), arguments.get("prompt")
        if name not in handle.agent.team:
            return ToolResult(f"unknown team mate {name!r}; your team is {sorted(handle.agent.team)}", is_error=True)
        if not isinstance(prompt, str) or not prompt:
            return ToolResult("task needs a non-empty 'prompt' string", is_error=True)
        result = await run_child(self.host, handle, run, key=call.id, agent_name=name, prompt=prompt)
        if isinstance(result, ToolResult):
            return result
        if result.status is Status.PENDING and result.pending is not None:
            return result.pending
        return ToolResult(prompts.task_output(result), is_error=result.status is not Status.DONE)


def _replayed(replaying: Recording, handle: Handle, call: ToolCall) -> ToolResult | UnrecordedCalls:
    """A replay's answer to a call: the recorded result of the same call, or what its policy
    does with one the recording does not have (an error result, or LIVE or HOST)."""
    recorded = replaying.answer(handle, call)
    if recorded is not None:
        return recorded.result
    if replaying.unrecorded is not UnrecordedCalls.RECORDED_ONLY:
        return replaying.unrecorded
    return ToolResult(
        "not run: this replay answers tool calls from its recording, which has no result for this one "
        "(the same handle, name and arguments at the same place): UNRECORDED_CALLS_RECORDED_ONLY",
        is_error=True,
    )


def _leaver(slot: RunningSlot) -> Callable[[asyncio.Future[Any]], None]:
    """A done callback: the call's task ended, so it is no longer one of its run's activities."""

    def leave(_: asyncio.Future[Any]) -> None:
        slot.leave()

    return leave
