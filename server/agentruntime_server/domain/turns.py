"""The turn loop. Its state is the transcript plus the journal, so a run re-entered at
any point (after a resume, or a restart) carries on from where it stopped:

- the last message is an assistant message with tool calls -> finish its tool phase
  (results already in the journal are read, not re-run);
- the last message is a final assistant answer -> put it through the completion gate;
- otherwise -> check the budget and make the next model call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any, Protocol

from . import budget as budgets
from . import patterns, prompts, schemas
from .errors import Detached, Fenced, ResourceExhausted, shown
from .gate import FifoGate
from .handle import Handle, Run
from .journal import (
    CallFinished,
    CallStarted,
    CallSuspended,
    Compacted,
    InDoubt,
    Journal,
    MessagesAppended,
    ModelReplied,
    Tree,
    TurnStarted,
)
from .limits import MAX_REPLY_TOKENS
from .model import (
    AgentSpec,
    Budget,
    Failure,
    FailureReason,
    GuardrailAction,
    HandleState,
    HttpExecutor,
    Limit,
    McpExecutor,
    Message,
    PendingRequest,
    RelayExecutor,
    ReplyStop,
    Status,
    TaskResult,
    Thinking,
    ToolCall,
    ToolResult,
    ToolSpec,
    ToolSuspension,
    WorkerExecutor,
)
from .ports import ModelReply, ModelRequest, ProviderError, Services, ToolSchema, WorkerLost
from .quotas import RunningSlot

EFFECTS = (HttpExecutor, WorkerExecutor, McpExecutor)  # calls that run outside the process
WORKER_ATTEMPTS = 3  # workers a call is given to, when each goes away with it, before it fails


class RunHost(Protocol):
    """What the turn loop needs from its runtime, and nothing more."""

    id: str
    key: str
    tenant: str
    tree: Tree
    journal: Journal
    services: Services
    draining: bool

    async def spawn_child(
        self, parent: Handle | None, agent: AgentSpec, budget_override: Budget | None, key: str | None, delegated: bool = True
    ) -> Handle: ...

    async def start_run(self, handle: Handle, prompt: str, parent_run: Run | None = None) -> Run: ...

    def settled_result(self, handle: Handle) -> TaskResult: ...

    @property
    def model_gate(self) -> FifoGate | None: ...

    async def queue_for(self, handle: Handle, gate: FifoGate) -> None: ...

    async def tokens_left(self) -> int | None: ...

    async def spend(self, tokens: int) -> None: ...


class TurnLoop:
    def __init__(self, host: RunHost) -> None:
        self.host = host
        self.services = host.services
        self._schemas: dict[str, tuple[ToolSchema, ...]] = {}
        self._validators: dict[tuple[str, str], schemas.ArgumentsSchema] = {}

    async def drive(self, handle: Handle, run: Run) -> TaskResult:
        while True:
            if self.host.draining:
                raise Detached
            last = handle.transcript[-1]
            if last.role == "assistant" and last.refusal:
                failure = Failure(FailureReason.MODEL_REFUSED, provider=self.services.models.provider_name(handle.agent))
                return handle.result(Status.ERROR, text=last.content, is_error=True, failure=failure)
            if last.role == "assistant" and last.truncated:
                cap = Limit.MAX_OUTPUT_TOKENS
                return handle.result(Status.INCOMPLETE, text=last.content or f"stopped at {cap.wire_name}", limit=cap)
            if last.role == "assistant" and last.tool_calls:
                outcome = await self._tool_phase(handle, run, last)
                if isinstance(outcome, PendingRequest):
                    if self._still_live(handle, outcome):
                        return handle.result(Status.PENDING, text=outcome.prompt, pending=outcome)
                elif outcome is not None:
                    return handle.result(Status.INCOMPLETE, text=f"stopped at {outcome.wire_name}", limit=outcome)
            elif last.role == "assistant":
                rejection = await self._completion_gate(handle, run, last.content)
                if isinstance(rejection, PendingRequest):  # the judge waits for the host
                    if self._still_live(handle, rejection):
                        return handle.result(Status.PENDING, text=rejection.prompt, pending=rejection)
                    continue  # answered meanwhile: the judge runs on, and is waited for again
                if rejection is None:
                    return handle.result(Status.DONE, text=last.content)
                # This rejection, after those of the run so far (counted in the transcript, so
                # that neither a Resume nor a restart starts the count again).
                if handle.gate_rejections() + 1 >= max(handle.agent.completion.max_attempts, 1):
                    return handle.result(Status.INCOMPLETE, text=rejection, limit=Limit.COMPLETION)
                await self.host.journal.record(MessagesAppended(handle.id, (prompts.gate_feedback(rejection),)))
            else:
                found = budgets.exhausted(handle)
                if found is not None:
                    limit, owner = found
                    if owner is handle and handle.budget.asks:
                        request = budget_request(handle, limit)
                        return handle.result(Status.PENDING, text=request.prompt, pending=request)
                    return handle.result(Status.INCOMPLETE, text=f"stopped at {limit.wire_name}", limit=limit)
                left = await self.host.tokens_left()
                if left is not None and left <= 0:
                    # No Limit of its own: the tenant's token quota is a budget over its runtimes.
                    text = "stopped: the tenant's model token quota for the last 24 hours is used up"
                    return handle.result(Status.INCOMPLETE, text=text, limit=Limit.MAX_TOKENS)
                waiting = await self._model_turn(handle, run)
                if waiting is not None and self._still_live(handle, waiting):  # the summarizer waits for the host
                    return handle.result(Status.PENDING, text=waiting.prompt, pending=waiting)

    def _still_live(self, handle: Handle, request: PendingRequest) -> bool:
        """A child's Request may have been answered while this phase waited for its siblings."""
        if request.path == handle.path:
            return True
        child = self.host.tree.handles.get("/".join(request.path))
        return child is not None and child.pending == request

    # ---- model ---------------------------------------------------------------------------

    async def _model_turn(self, handle: Handle, run: Run) -> PendingRequest | None:
        """One model call, journaled; or, when the compaction before it waits on its
        summarizer's Request, that Request (no call is made)."""
        agent = handle.agent
        system = (Message(role="system", content=agent.instructions),) if agent.instructions else ()
        tools = self._tool_schemas(handle)
        request = ModelRequest(agent=agent, messages=system + handle.model_view(), tools=tools)
        if agent.compaction is not None and _size(request) > agent.compaction.max_context_tokens:
            compacted = await self._compact(handle, run)
            if isinstance(compacted, PendingRequest):
                return compacted
            if compacted:
                request = ModelRequest(agent=agent, messages=system + handle.model_view(), tools=tools)
        if run.slot is not None:
            await run.slot.hold()  # the turn is work: it takes a running slot of the tenant's (back)
        await self.host.journal.record(TurnStarted(handle.id, handle.usage.turns + 1))
        gate = self.host.model_gate
        if gate is None:
            reply = await self._complete(request)
        else:
            await self.host.queue_for(handle, gate)
            try:
                reply = await self._complete(request)
            finally:
                gate.release()
        tokens = reply.tokens
        if tokens is None:
            tokens = estimate_tokens(request, reply)
        elif not 0 <= tokens <= MAX_REPLY_TOKENS:
            provider = self.services.models.provider_name(handle.agent)
            raise ProviderError(
                f"the model reported {shown(str(tokens), 24)} tokens for one reply "
                f"(a reply counts 0 to {MAX_REPLY_TOKENS:,}); the reply was not used",
                Failure(FailureReason.PROVIDER_BAD_REPLY, provider=provider, detail="absurd usage"),
            )
        turn = handle.usage.turns + 1
        calls = tuple(
            ToolCall(id=f"call_{turn}_{position}", name=_unicode(call.name), arguments_json=_unicode(call.arguments_json) or "{}")
            for position, call in enumerate(reply.tool_calls, start=1)
        )
        message = Message(
            role="assistant",
            content=_unicode(reply.text),
            tool_calls=calls,
            turn=turn,
            refusal=reply.stop is ReplyStop.REFUSAL,
            truncated=reply.stop is ReplyStop.MAX_OUTPUT_TOKENS,
            thinking=tuple(Thinking(_unicode(t.text), _unicode(t.signature), _unicode(t.redacted_data)) for t in reply.thinking),
        )
        # The reply is journaled before it is acted on: a re-entered turn never buys it again.
        estimated = reply.tokens is None
        await self.host.journal.record(ModelReplied(handle.id, message, tokens, handle.usage.after_reply(tokens), estimated))
        await self.host.spend(tokens)
        return None

    async def _complete(self, request: ModelRequest) -> ModelReply:
        """The model call, bought only while this process holds the runtime: a replica paused
        or starved past its lease (it wakes with a tool's answer in hand) learns first that
        another replica took the runtime over and bought this turn already."""
        leases = self.services.leases
        await leases.confirm()
        if not leases.holds(self.host.key):
            raise Fenced(self.host.key)
        return await self.services.models.complete(request)

    async def _compact(self, handle: Handle, run: Run) -> bool | PendingRequest:
        """Older turns give way to a summary in the model's view (the transcript keeps them):
        the summarizer agent, run as a child, writes it; its tokens bill to this handle's
        tree. False when there is nothing old enough to summarize, or no summary came; the
        summarizer's Request when it suspended (the handle suspends on it, as on a task call)."""
        compaction = handle.agent.compaction
        assert compaction is not None
        start = handle.compactions[-1][0] if handle.compactions else 0
        turns = [i for i in range(start, len(handle.transcript)) if handle.transcript[i].role == "assistant"]
        keep = compaction.keep_last_turns or 2
        if len(turns) <= keep:
            return False
        cut = turns[-keep]
        earlier = handle.compactions[-1][1].content if handle.compactions else ""
        prompt = prompts.compaction_prompt(earlier, handle.transcript[start:cut])
        # Keyed by the run and the turn: a re-entered turn (a Resume, a restart) reattaches to its
        # summarizer, a later turn gets its own, and so does the next run after a rolled-back one
        # (its turn may have the same number: an interrupted turn's reply is never counted).
        key = f"compaction_run_{handle.runs}_turn_{handle.usage.turns + 1}"
        result = await self.run_child(
            handle, run, key=key, agent_name=compaction.summarizer_agent, prompt=prompt, delegated=False
        )
        if isinstance(result, TaskResult) and result.status is Status.PENDING and result.pending is not None:
            return result.pending
        if isinstance(result, ToolResult) or result.status is not Status.DONE or not result.text.strip():
            return False
        await self.host.journal.record(Compacted(handle.id, cut, prompts.summary_message(result.text)))
        return True

    def _tool_schemas(self, handle: Handle) -> tuple[ToolSchema, ...]:
        """What the model may call; an agent's definition never changes, so it is built once."""
        agent = handle.agent
        cached = self._schemas.get(agent.name)
        if cached is not None:
            return cached
        schemas = [
            ToolSchema(spec.name, spec.description, spec.input_schema or {"type": "object", "properties": {}})
            for spec in agent.tools
        ]
        if agent.team:
            schemas.append(prompts.task_tool([self.host.tree.agents[name] for name in agent.team]))
        schemas.append(prompts.ASK_TOOL)
        self._schemas[agent.name] = tuple(schemas)
        return self._schemas[agent.name]

    # ---- tools ---------------------------------------------------------------------------

    async def _tool_phase(self, handle: Handle, run: Run, message: Message) -> Limit | PendingRequest | None:
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
        for call in runnable:
            kind = self._suspension_kind(handle, call)
            if kind == "relay":
                relay.append(call)
            elif kind:
                held.append(self._own_request(handle, kind, [call]))
            else:
                prepared = self._prepare(handle, call)
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
            calls = [self._call(handle, run, *call) for call in now]
            tasks = [asyncio.ensure_future(call if lent is None else self._activity(lent, call)) for call in calls]
            try:
                child_requests = await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:  # one call failed (or the run stops): none outlives the run
                    task.cancel()
                raise
            finally:
                if lent is not None:
                    lent.join()  # the loop goes on (a slot is taken back before its next work)
        own = ([self._own_request(handle, "tool_call", relay)] if relay else []) + held
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

    @staticmethod
    async def _activity(slot: RunningSlot | None, call: Awaitable[PendingRequest | None]) -> PendingRequest | None:
        """One of a phase's calls, counted among its run's activities until it ends."""
        try:
            return await call
        finally:
            if slot is not None:
                slot.leave()

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
            kind = "approval"
        elif spec is not None and isinstance(spec.executor, RelayExecutor):
            kind = "relay"
        else:
            return ""
        # Arguments a tool would refuse never reach the host or a person: the call is an
        # error result for the model now (_prepare gives it), as for a tool that runs here.
        return "" if isinstance(self._arguments(handle, call), ToolResult) else kind

    def _own_request(self, handle: Handle, kind: str, calls: list[ToolCall]) -> PendingRequest:
        keyed = tuple((call, self.idempotency_key(handle, call)) for call in calls)
        first = calls[0]
        data: dict[str, Any] = {
            "calls": [
                {"id": call.id, "name": call.name, "arguments_json": call.arguments_json, "idempotency_key": key}
                for call, key in keyed
            ]
        }
        prompt = ""
        if kind == "approval":
            spec = handle.agent.tool(first.name)
            rail = handle.agent.guardrail(first.name)
            prompt = (spec.approval_prompt if spec else "") or (rail.reason if rail else "") or f"Allow {first.name}?"
            prompt = f"{prompt} ({first.name} {first.arguments_json})"
        elif kind == "input":
            prompt = _question(first)
        elif kind == "tool_call":
            prompt = f"Run {', '.join(call.name for call in calls)} and Resume with one output per call"
        elif kind == "in_doubt":
            prompt = (
                f"{first.name} {first.arguments_json} was cut off before it answered (the server stopped, or "
                "its worker went away) and may or may not have taken effect: answer ok with an output to use "
                "it, ok without one to run it again, "
                "or not ok to fail the call"
            )
        # The kind is part of the id: one call can ask twice (approval, then its relay output).
        request_id = f"{handle.id}/{first.id}:{kind}"
        if kind == "in_doubt":
            # In doubt again after the host had it run again: a Request of its own, lest a retry
            # of the Resume that answered the last one be read as an answer to this one.
            again = 1
            while request_id in self.host.tree.answered:
                again += 1
                request_id = f"{handle.id}/{first.id}:in_doubt.{again}"
        return PendingRequest(id=request_id, kind=kind, prompt=prompt, data=data, path=handle.path, calls=keyed)

    def _tool_request(self, handle: Handle, call: ToolCall, asked: ToolSuspension) -> PendingRequest:
        """The Request a running tool asked for (HTTP 202); answered, the tool is called again."""
        rounds = handle.tool_rounds.get(call.id, 1)
        return PendingRequest(
            id=f"{handle.id}/{call.id}:{asked.kind}.{rounds}",
            kind=asked.kind,
            prompt=asked.prompt or f"{call.name} needs the host ({asked.kind})",
            url=asked.url,
            data=dict(asked.data),
            path=handle.path,
            calls=((call, self.idempotency_key(handle, call)),),
            expires_at=asked.expires_at,
            from_tool=True,
        )

    def idempotency_key(self, handle: Handle, call: ToolCall) -> str:
        return f"{self.host.key}/{handle.id}/{call.id}"

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
            result = await self.services.mcp.call(prepared, arguments, self.idempotency_key(handle, call))
        elif effect:
            assert isinstance(prepared, HttpExecutor)
            await self.services.store.flush(self.host.key)  # the call leaves the process next: it must be known to have started
            key = self.idempotency_key(handle, call)
            outcome = await self.services.http_tools.run(prepared, call.arguments_json, key, handle.tool_answers.get(call.id))
            if isinstance(outcome, ToolSuspension):
                await self.host.journal.record(CallSuspended(handle.id, call.id))
                return self._tool_request(handle, call, outcome)
            result = outcome
        else:
            assert isinstance(prepared, dict)
            result = await self._delegate(handle, run, call, prepared)
        if isinstance(result, PendingRequest):
            return result
        await self.record(handle, call, result)
        return None

    async def _on_worker(self, handle: Handle, call: ToolCall, executor: WorkerExecutor) -> ToolResult | PendingRequest:
        """A worker's output. A worker lost with the call in hand leaves it in doubt: ASK
        suspends on an `in_doubt` Request; otherwise another worker runs it, with the same key."""
        key = self.idempotency_key(handle, call)
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
                    return self._own_request(handle, "in_doubt", [call])
        return ToolResult(
            f"{WORKER_ATTEMPTS} workers took the call and none answered: it may or may not have taken effect", is_error=True
        )

    async def record(self, handle: Handle, call: ToolCall, result: ToolResult) -> None:
        """Journals a call's result (once: a call already recorded keeps its first result)."""
        if call.id not in handle.tool_results:
            await self.host.journal.record(CallFinished(handle.id, call, result))

    def _schema_problem(self, handle: Handle, spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
        """Why the arguments fail the tool's schema (compiled once per tool), or None."""
        key = (handle.agent.name, spec.name)
        validator = self._validators.get(key)
        if validator is None:
            validator = self._validators[key] = schemas.ArgumentsSchema(spec.input_schema)
        try:
            problem = validator.problem(arguments)
        except schemas.VALIDATION_FAULTS as exc:
            return f"the schema could not be applied ({type(exc).__name__})"
        return None if problem is None else shown(problem, 300)

    @staticmethod
    def find_call(handle: Handle, call_id: str) -> ToolCall | None:
        for message in reversed(handle.transcript):
            for call in message.tool_calls:
                if call.id == call_id:
                    return call
        return None

    def _prepare(
        self, handle: Handle, call: ToolCall
    ) -> ToolResult | HttpExecutor | WorkerExecutor | McpExecutor | dict[str, Any]:
        """What running the call takes: an error result now, the http tool to call, or the
        task arguments to delegate with."""
        agent = handle.agent
        rail = agent.guardrail(call.name)
        if rail is not None and rail.action is GuardrailAction.DENY:
            return ToolResult(f"denied by guardrail: {rail.reason or 'this tool is not allowed'}", is_error=True)
        arguments = self._arguments(handle, call)
        if isinstance(arguments, ToolResult) or (call.name == "task" and agent.team):
            return arguments
        spec = agent.tool(call.name)
        assert spec is not None  # _arguments refuses an unknown tool
        assert not isinstance(spec.executor, RelayExecutor)  # valid relay calls suspend before they get here
        return spec.executor

    def _arguments(self, handle: Handle, call: ToolCall) -> dict[str, Any] | ToolResult:
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
            problem = self._schema_problem(handle, spec, arguments)
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
        result = await self.run_child(handle, run, key=call.id, agent_name=name, prompt=prompt)
        if isinstance(result, ToolResult):
            return result
        if result.status is Status.PENDING and result.pending is not None:
            return result.pending
        return ToolResult(prompts.task_output(result), is_error=result.status is not Status.DONE)

    async def run_child(
        self, handle: Handle, run: Run, key: str, agent_name: str, prompt: str, delegated: bool = True
    ) -> TaskResult | ToolResult:
        """Runs (or reattaches to) the child keyed by `key`; a refused spawn is an error result.
        Not `delegated`: a judge or a summarizer (budgets.carve)."""
        child = handle.children_by_key.get(key)
        if child is None:
            try:
                child = await self.host.spawn_child(handle, self.host.tree.agents[agent_name], None, key=key, delegated=delegated)
            except ResourceExhausted as exc:
                # A budget's limit, or a tenant's quota (QUOTA_EXCEEDED): the model may judge it.
                why = exc.limit.wire_name if exc.limit is not Limit.NONE else exc.reason
                return ToolResult(f"not spawned: {exc} ({why})", is_error=True)
            await self.host.start_run(child, prompt, parent_run=run)
        elif child.run is None and child.last_result is None and child.state is HandleState.IDLE:
            # Spawned, but its run never reached the journal (the process died between the two
            # steps): it never ran, so nothing of it can run twice. It runs now, on the same
            # prompt (the call's, or one rebuilt from the same transcript), instead of giving
            # the parent a never-run error.
            await self.host.start_run(child, prompt, parent_run=run)
        if child not in run.children:
            run.children.append(child)
        if child.run is not None and child.run.task is not None:
            if run.slot is None:
                result = await asyncio.shield(child.run.task)
            else:
                run.slot.leave()  # only waiting: the slot is lent out to the tenant's other handles
                try:
                    result = await asyncio.shield(child.run.task)
                finally:
                    run.slot.join()
            if result.status is Status.UNSPECIFIED:
                raise Detached  # the child stopped for shutdown: so does this run, unrecorded
            return result
        return self.host.settled_result(child)

    # ---- completion gate ---------------------------------------------------------------------

    async def _completion_gate(self, handle: Handle, run: Run, text: str) -> str | PendingRequest | None:
        """None when the final answer is accepted, else the reason it was not; or the judge's
        Request when the judge suspended (the handle suspends on it, as on a task call, and
        reads the verdict when it goes on)."""
        gate = handle.agent.completion
        if gate.must_match and not patterns.search(gate.must_match, text):
            return f"the answer does not match {shown(gate.must_match)}"
        if gate.judge_agent:
            # The task is the message the run started on (a continued run's mark is later on).
            task = next((m.content for m in reversed(handle.transcript[: handle.run_start + 1]) if m.role == "user"), "")
            verdict = await self.run_child(
                handle,
                run,
                key=f"judge_turn_{handle.usage.turns}",
                agent_name=gate.judge_agent,
                prompt=prompts.judge_prompt(task, text),
                delegated=False,
            )
            if isinstance(verdict, TaskResult) and verdict.status is Status.PENDING and verdict.pending is not None:
                return verdict.pending
            verdict_text = verdict.output if isinstance(verdict, ToolResult) else verdict.text
            if not verdict_text.strip().startswith("PASS"):
                return f"the judge {gate.judge_agent!r} said: {verdict_text.strip() or '(nothing)'}"
        return None


def _size(request: ModelRequest) -> int:
    """A request's size in tokens, as compaction counts it: about four characters a token."""
    return _sent_chars(request) // 4 + 1


def _sent_chars(request: ModelRequest) -> int:
    chars = sum(len(m.content) + sum(len(c.arguments_json) for c in m.tool_calls) for m in request.messages)
    return chars + sum(len(tool.description) + len(str(tool.parameters)) for tool in request.tools)


def budget_request(handle: Handle, limit: Limit) -> PendingRequest:
    """A budget that asks (ON_EXHAUSTED_ASK): the host may extend it. The id names the limit,
    the figure and the cap, so a re-entered turn asks with the same id, and a new ask after
    an extension gets a new one."""
    usage, budget = handle.usage, handle.budget
    figure, cap = {
        Limit.MAX_TURNS: (usage.turns, budget.max_turns),
        Limit.MAX_TOKENS: (usage.total_tokens, budget.max_tokens),
        Limit.MAX_TOOL_CALLS: (usage.subtree_tool_calls, budget.max_tool_calls),
    }[limit]
    field = {Limit.MAX_TURNS: "max_turns", Limit.MAX_TOKENS: "max_tokens", Limit.MAX_TOOL_CALLS: "max_tool_calls"}[limit]
    data = {
        "limit": limit.wire_name,
        "field": field,
        "used": figure,
        "budget": cap,
        "usage": {
            "turns": usage.turns,
            "own_tokens": usage.own_tokens,
            "total_tokens": usage.total_tokens,
            "tool_calls": usage.tool_calls,
        },
    }
    prompt = (
        f"{handle.id} reached {limit.wire_name} ({figure} of {cap}): Resume with ok and "
        f'data {{"extend": {{"{field}": <a higher value>}}}} to raise it and go on, or not ok to stop'
    )
    return PendingRequest(
        id=f"{handle.id}/budget:{limit.wire_name}@{figure}/{cap}", kind="budget", prompt=prompt, data=data, path=handle.path
    )


def estimate_tokens(request: ModelRequest, reply: ModelReply) -> int:
    """A reply's usage when the provider reports none: about four characters a token of
    everything sent (messages and tool schemas) and received, so that budgets still bite."""
    sent = _sent_chars(request)
    received = len(reply.text) + sum(len(call.name) + len(call.arguments_json) for call in reply.tool_calls)
    return (sent + received) // 4 + 1


def _unicode(text: str) -> str:
    """Text as UTF-8 can carry it: a provider's JSON may hold lone surrogates ("\\ud800"),
    which no store and no client could encode."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
    return text


def _question(call: ToolCall) -> str:
    try:
        arguments = json.loads(call.arguments_json)
    except ValueError:
        return call.arguments_json
    question = arguments.get("question") if isinstance(arguments, dict) else None
    return str(question) if question else call.arguments_json
