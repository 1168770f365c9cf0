"""The turn loop. Its state is the transcript plus the journal, so a run re-entered at
any point (after a resume, or a restart) carries on from where it stopped:

- the last message is an assistant message with tool calls -> finish its tool phase
  (tool_phase.py: results already in the journal are read, not re-run);
- the last message is a final assistant answer -> put it through the completion gate
  (completion_gate.py);
- otherwise -> check the budget and make the next model call.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from ..billing.usage import Tokens
from ..errors import Detached, Fenced, shown
from ..journal import Compacted, MessagesAppended, ModelReplied, TurnStarted
from ..journal.handle import Handle
from ..limits import MAX_REPLY_TOKENS
from ..ports import ModelReply, ModelRequest, ProviderError, ReplyBound, ToolSchema
from ..suspension.requests import budget_request
from ..vocabulary import (
    Failure,
    FailureReason,
    Limit,
    Message,
    PendingRequest,
    ReplyStop,
    Status,
    TaskResult,
    Thinking,
    ToolCall,
    ToolResult,
)
from . import budgets, completion_gate, prompts, reservations, typed_answers
from .delegation import run_child
from .driver import Run, RunHost
from .reservations import Reservation
from .tool_phase import ToolPhase


class TurnLoop:
    def __init__(self, host: RunHost) -> None:
        self.host = host
        self.services = host.services
        self.tool_phase = ToolPhase(host)
        self.typed_answers = typed_answers.OutputSchemas(self.services.schema_judge, host.tenant)
        self._schemas: dict[str, tuple[ToolSchema, ...]] = {}
        self._schema_chars: dict[str, int] = {}  # agent -> its tool schemas' characters, as _sent_chars counts them

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
                outcome = await self.tool_phase.run(handle, run, last)
                if isinstance(outcome, PendingRequest):
                    if self._still_live(handle, outcome):
                        return handle.result(Status.PENDING, text=outcome.prompt, pending=outcome)
                elif outcome is not None:
                    return handle.result(Status.INCOMPLETE, text=f"stopped at {outcome.wire_name}", limit=outcome)
            elif last.role == "assistant":
                output: Any = None
                rejection: str | PendingRequest | None = None
                if handle.agent.output_schema is not None:  # judged before the gate: a judge reads valid JSON
                    output, rejection = await self.typed_answers.judge_answer(handle.agent, last.content)
                if rejection is None:
                    rejection = await completion_gate.rejection(self.host, handle, run, last.content)
                if isinstance(rejection, PendingRequest):  # the judge waits for the host
                    if self._still_live(handle, rejection):
                        return handle.result(Status.PENDING, text=rejection.prompt, pending=rejection)
                    continue  # answered meanwhile: the judge runs on, and is waited for again
                if rejection is None:
                    return handle.result(Status.DONE, text=last.content, output=output)
                # This rejection, after those of the run so far (counted in the transcript, so
                # that neither a Resume nor a restart starts the count again).
                if handle.gate_rejections() + 1 >= typed_answers.attempts(handle.agent):
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
                money = await self.host.cost_left()
                if money is not None and money <= 0:
                    text = "stopped: the tenant's model cost quota for the last 24 hours is used up"
                    return handle.result(Status.INCOMPLETE, text=text, limit=Limit.MAX_COST)
                waiting = await self._model_turn(handle, run)
                if isinstance(waiting, TaskResult):  # its reservation did not fit: no call was made
                    return waiting
                if waiting is not None and self._still_live(handle, waiting):  # the summarizer waits for the host
                    return handle.result(Status.PENDING, text=waiting.prompt, pending=waiting)

    def _still_live(self, handle: Handle, request: PendingRequest) -> bool:
        """A child's Request may have been answered while this phase waited for its siblings."""
        if request.path == handle.path:
            return True
        child = self.host.tree.handles.get("/".join(request.path))
        return child is not None and child.pending == request

    # ---- model ---------------------------------------------------------------------------

    async def _model_turn(self, handle: Handle, run: Run) -> PendingRequest | TaskResult | None:
        """One model call, journaled; or, when the compaction before it waits on its
        summarizer's Request, that Request; or, when its reservation does not fit a budget or
        a quota, the run's result (its stop, or its budget's Request): no call is made."""
        agent = handle.agent
        system = (Message(role="system", content=agent.instructions),) if agent.instructions else ()
        tools = self._tool_schemas(handle)
        cache_key = prompt_cache_key(self.host.key, handle.id) if agent.prompt_cache else ""
        request = ModelRequest(agent, system + handle.model_view(), tools, cache_key)
        if agent.compaction is not None and self._size(request) > agent.compaction.max_context_tokens:
            compacted = await self._compact(handle, run)
            if isinstance(compacted, PendingRequest):
                return compacted
            if compacted:
                request = ModelRequest(agent, system + handle.model_view(), tools, cache_key)
        reservation = await self._reserve(handle, request)
        if isinstance(reservation, TaskResult):
            return reservation
        stream = None
        try:
            if run.slot is not None:
                await run.slot.hold()  # the turn is work: it takes a running slot of the tenant's (back)
            turn = handle.usage.turns + 1
            rerun = handle.turn_begun == turn  # begun before (a crash, a failover, an interrupt): its reply never came
            await self.host.journal.record(TurnStarted(handle.id, turn))
            events = self.host.events
            # A scripted reply always streams: no wire to read, and it takes as long watched or not.
            if self.services.stream_always or events.wants_deltas or agent.script:
                stream = events.open_stream(handle.id, turn)
                if rerun:
                    stream.restart("rerun")  # watchers that saw an earlier go at it clear it
                request = dataclasses.replace(request, stream=stream)
            await self._reply_turn(handle, request, reservation)
        finally:
            if reservation is not None:
                reservation.release()  # the reply's figures count now, or there is no reply (failed, cancelled)
            if stream is not None:
                stream.close()  # after its reply's TurnEnded: a watcher reconnecting meanwhile has one or the other
        return None

    async def _reserve(self, handle: Handle, request: ModelRequest) -> Reservation | TaskResult | None:
        """The turn's reservation (reservations.py), held against every budget of the lineage
        that caps tokens or cost and the tenant's quotas of them; None when nothing caps it (or
        its model reserves nothing); the run's result when it does not fit."""
        tenancy, tenant = self.host.tenancy, self.host.tenant
        by_budgets = budgets.capped(handle)
        by_quota = tenancy is not None and tenancy.caps_spend(tenant)
        if not by_budgets and not by_quota:
            return None
        bound = self.services.models.reply_bound(handle.agent)
        if bound is None:
            return None
        price = self.services.prices.price(self.services.models.provider_name(handle.agent), bound.model)
        tokens, micros = reservations.estimate(self._size(request), bound, price)
        if by_budgets:
            found = budgets.unaffordable(handle, tokens, micros)
            if found is not None:
                limit, owner = found
                if owner is handle and handle.budget.asks:
                    asked = budget_request(handle, limit, tokens if limit is Limit.MAX_TOKENS else micros)
                    return handle.result(Status.PENDING, text=asked.prompt, pending=asked)
                return handle.result(Status.INCOMPLETE, text=_unaffordable(limit, owner, tokens, micros, bound), limit=limit)
        reservation = reservations.Reservation(handle, tokens, micros, by_budgets)
        if by_quota and tenancy is not None:
            try:
                refused = await tenancy.reserve(tenant, tokens, micros)
            except BaseException:
                reservation.release()
                raise
            if refused is not None:
                reservation.release()
                return handle.result(Status.INCOMPLETE, text=refused[1], limit=refused[0])
            reservation.held_by(tenancy, tenant)
        return reservation

    async def _reply_turn(self, handle: Handle, request: ModelRequest, reservation: Reservation | None = None) -> None:
        """The model call of a turn begun, and its reply journaled."""
        gate = self.host.model_gate
        if gate is None:
            reply = await self._complete(request)
        else:
            await self.host.runs.queue_for(handle, gate)
            try:
                reply = await self._complete(request)
            finally:
                gate.release()
        provider = self.services.models.provider_name(handle.agent)
        split = reply.usage
        if split is None:
            split = estimate_tokens(request, reply)
        elif not _sane(split):
            raise ProviderError(
                f"the model reported {shown(str(split.total), 24)} tokens for one reply, split as"
                f" {shown(_figures(split), 120)} (a reply counts 0 to {MAX_REPLY_TOKENS:,}, each part at least 0,"
                " reasoning within output); the reply was not used",
                Failure(FailureReason.PROVIDER_BAD_REPLY, provider=provider, detail="absurd usage"),
            )
        tokens = split.total
        cost = self.services.prices.cost(provider, reply.model, split)
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
        estimated = reply.usage is None
        after = handle.usage.after_reply(split, cost, estimated)
        await self.host.journal.record(ModelReplied(handle.id, message, tokens, after, estimated, split, cost))
        if reservation is not None:
            reservation.release_budgets()  # the reply's own figures count from this record on
        await self.host.spend(tokens, cost.micros)

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
        result = await run_child(
            self.host, handle, run, key=key, agent_name=compaction.summarizer_agent, prompt=prompt, delegated=False
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
        self._schema_chars[agent.name] = _schema_chars(self._schemas[agent.name])
        return self._schemas[agent.name]

    def _size(self, request: ModelRequest) -> int:
        """A request's size in tokens, as compaction counts it and a turn is reserved: about
        four characters a token of what is sent (its tools' part counted once per agent)."""
        chars = self._schema_chars.get(request.agent.name)
        if chars is None:
            chars = _schema_chars(request.tools)
        return (_message_chars(request) + chars) // 4 + 1


def _message_chars(request: ModelRequest) -> int:
    return sum(len(m.content) + sum(len(c.arguments_json) for c in m.tool_calls) for m in request.messages)


def _schema_chars(tools: tuple[ToolSchema, ...]) -> int:
    return sum(len(tool.description) + len(str(tool.parameters)) for tool in tools)


def _sent_chars(request: ModelRequest) -> int:
    return _message_chars(request) + _schema_chars(request.tools)


def estimate_tokens(request: ModelRequest, reply: ModelReply) -> Tokens:
    """A reply's usage when the provider reports none: about four characters a token of
    everything sent (messages and tool schemas: input) and received (output), so that
    budgets still bite."""
    sent = _sent_chars(request)
    received = len(reply.text) + sum(len(call.name) + len(call.arguments_json) for call in reply.tool_calls)
    total = (sent + received) // 4 + 1
    sent_tokens = min(sent // 4 + 1, total)
    return Tokens(input=sent_tokens, output=total - sent_tokens)


def _unaffordable(limit: Limit, owner: Handle, tokens: int, micros: int, bound: ReplyBound) -> str:
    """Why a turn did not start: its reservation against the budget that cannot hold it."""
    if limit is Limit.MAX_TOKENS:
        field, cap, spent, held, need, unit = (
            "max_tokens",
            owner.budget.max_tokens,
            owner.usage.total_tokens,
            owner.held_tokens,
            tokens,
            "tokens",
        )
    else:
        field, cap, spent, held, need, unit = (
            "max_cost",
            owner.budget.max_cost,
            owner.usage.total_cost.micros,
            owner.held_micros,
            micros,
            "micros",
        )
    output = f"its output cap of {bound.output_cap:,} tokens" if bound.output_cap else "no output cap"
    left = max((cap or 0) - spent - held, 0)
    return (
        f"stopped at {limit.wire_name}: the next turn is reserved {need:,} {unit} (its input at about four characters"
        f" a token, and {output}) and {owner.id}'s {field} of {cap:,} has {left:,} left ({spent:,} spent, {held:,}"
        " held by turns under way)"
    )


def _sane(split: Tokens) -> bool:
    parts = (split.input, split.cache_read, split.cache_write, split.output, split.reasoning)
    return all(part >= 0 for part in parts) and split.reasoning <= split.output and split.total <= MAX_REPLY_TOKENS


def _figures(split: Tokens) -> str:
    return (
        f"input {split.input}, cache reads {split.cache_read}, cache writes {split.cache_write},"
        f" output {split.output}, reasoning {split.reasoning}"
    )


def prompt_cache_key(runtime_key: str, handle_id: str) -> str:
    """Stable across a handle's turns and restarts, different for each handle (and tenant):
    what OpenAI routes cached prompts by. A digest, so that no id reaches the provider."""
    return hashlib.blake2b(f"{runtime_key}\n{handle_id}".encode(), digest_size=16).hexdigest()


def _unicode(text: str) -> str:
    """Text as UTF-8 can carry it: a provider's JSON may hold lone surrogates ("\\ud800"),
    which no store and no client could encode."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
    return text
