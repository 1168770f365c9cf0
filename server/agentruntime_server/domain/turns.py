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
from typing import TYPE_CHECKING, Any

import jsonschema

from . import budget as budgets
from . import prompts
from .errors import ResourceExhausted
from .handle import Handle, Run
from .model import GuardrailAction, HttpExecutor, Limit, Message, Status, TaskResult, ToolCall, ToolResult
from .ports import ModelRequest, ToolSchema

if TYPE_CHECKING:
    from .runtime import Runtime


class TurnLoop:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.services = runtime.services

    async def drive(self, handle: Handle, run: Run) -> TaskResult:
        while True:
            last = handle.transcript[-1]
            if last.role == "assistant" and last.tool_calls:
                limit = await self._tool_phase(handle, run, last)
                if limit is not None:
                    return handle.result(Status.INCOMPLETE, text=f"stopped at {limit.wire_name}", limit=limit)
            elif last.role == "assistant":
                rejection = await self._completion_gate(handle, run, last.content)
                if rejection is None:
                    return handle.result(Status.DONE, text=last.content)
                run.gate_attempts += 1
                if run.gate_attempts >= max(handle.agent.completion.max_attempts, 1):
                    return handle.result(Status.INCOMPLETE, text=rejection, limit=Limit.COMPLETION)
                await self.runtime.append_message(handle, prompts.gate_feedback(rejection))
            else:
                limit = budgets.turn_stop(handle)
                if limit is not None:
                    return handle.result(Status.INCOMPLETE, text=f"stopped at {limit.wire_name}", limit=limit)
                await self._model_turn(handle)

    # ---- model ---------------------------------------------------------------------------

    async def _model_turn(self, handle: Handle) -> None:
        agent = handle.agent
        system = (Message(role="system", content=agent.instructions),) if agent.instructions else ()
        request = ModelRequest(agent=agent, messages=system + tuple(handle.transcript), tools=self._tool_schemas(handle))
        reply = await self.services.models.complete(request)
        turn = handle.turns + 1
        calls = tuple(
            ToolCall(id=f"call_{turn}_{index}", name=call.name, arguments_json=call.arguments_json or "{}")
            for index, call in enumerate(reply.tool_calls, start=1)
        )
        message = Message(role="assistant", content=reply.text, tool_calls=calls, turn=turn)
        # The usage roll-up and the transcript change together, with no await between.
        handle.turns = turn
        handle.own_tokens += reply.tokens
        for node in handle.lineage():
            node.total_tokens += reply.tokens
        handle.transcript.append(message)
        await self.services.store.record_model_reply(
            self.runtime.id, handle.id, message, reply.tokens, handle.ancestor_ids()
        )

    def _tool_schemas(self, handle: Handle) -> tuple[ToolSchema, ...]:
        agent = handle.agent
        schemas = [
            ToolSchema(spec.name, spec.description, spec.input_schema or {"type": "object", "properties": {}})
            for spec in agent.tools
        ]
        if agent.team:
            schemas.append(prompts.task_tool([self.runtime.agents[name] for name in agent.team]))
        return tuple(schemas)

    # ---- tools ---------------------------------------------------------------------------

    async def _tool_phase(self, handle: Handle, run: Run, message: Message) -> Limit | None:
        fresh = [call for call in message.tool_calls if call.id not in handle.tool_results]
        allowed = budgets.tool_calls_left(handle)
        runnable = fresh if allowed is None else fresh[:allowed]
        refused = fresh[len(runnable) :]
        await asyncio.gather(*(self._call(handle, run, call) for call in runnable))
        for call in message.tool_calls:
            result = handle.tool_results.get(call.id) or ToolResult(
                f"not run: the tool call budget is used up ({Limit.MAX_TOOL_CALLS.wire_name})", is_error=True
            )
            await self.runtime.append_message(
                handle, Message(role="tool", content=result.output, tool_call_id=call.id, is_error=result.is_error)
            )
        return Limit.MAX_TOOL_CALLS if refused else None

    async def _call(self, handle: Handle, run: Run, call: ToolCall) -> None:
        result = await self._execute_call(handle, run, call)
        handle.tool_results[call.id] = result
        handle.tool_calls += 1
        for node in handle.lineage():
            node.subtree_tool_calls += 1
        await self.services.store.record_tool_result(self.runtime.id, handle.id, call.id, result, handle.ancestor_ids())

    async def _execute_call(self, handle: Handle, run: Run, call: ToolCall) -> ToolResult:
        agent = handle.agent
        rail = agent.guardrail(call.name)
        if rail is not None and rail.action is GuardrailAction.DENY:
            return ToolResult(f"denied by guardrail: {rail.reason or 'this tool is not allowed'}", is_error=True)
        try:
            arguments = json.loads(call.arguments_json)
        except ValueError as exc:
            return ToolResult(f"the arguments are not valid JSON: {exc}", is_error=True)
        if not isinstance(arguments, dict):
            return ToolResult("the arguments must be a JSON object", is_error=True)
        if call.name == "task" and agent.team:
            return await self._delegate(handle, run, call, arguments)
        spec = agent.tool(call.name)
        if spec is None:
            known = sorted([tool.name for tool in agent.tools] + (["task"] if agent.team else []))
            return ToolResult(f"unknown tool {call.name!r}; available tools: {known}", is_error=True)
        if spec.input_schema:
            try:
                jsonschema.validate(arguments, spec.input_schema)
            except jsonschema.ValidationError as exc:
                return ToolResult(f"the arguments do not match the tool's schema: {exc.message}", is_error=True)
        if isinstance(spec.executor, HttpExecutor):
            key = f"{self.runtime.id}/{handle.id}/{call.id}"
            return await self.services.http_tools.run(spec.executor, call.arguments_json, key)
        return ToolResult(f"tool {call.name!r} needs the host (relay), which this server version does not do yet", is_error=True)

    # ---- delegation ------------------------------------------------------------------------

    async def _delegate(self, handle: Handle, run: Run, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        name, prompt = arguments.get("agent"), arguments.get("prompt")
        if name not in handle.agent.team:
            return ToolResult(f"unknown team mate {name!r}; your team is {sorted(handle.agent.team)}", is_error=True)
        if not isinstance(prompt, str) or not prompt:
            return ToolResult("task needs a non-empty 'prompt' string", is_error=True)
        result = await self.run_child(handle, run, key=call.id, agent_name=name, prompt=prompt)
        if isinstance(result, ToolResult):
            return result
        return ToolResult(prompts.task_output(result), is_error=result.status is not Status.DONE)

    async def run_child(
        self, handle: Handle, run: Run, key: str, agent_name: str, prompt: str
    ) -> TaskResult | ToolResult:
        """Runs (or reattaches to) the child keyed by `key`; a refused spawn is an error result."""
        child = handle.children_by_key.get(key)
        if child is None:
            try:
                child = await self.runtime.spawn_child(handle, self.runtime.agents[agent_name], None, key=key)
            except ResourceExhausted as exc:
                return ToolResult(f"not spawned: {exc} ({exc.limit.wire_name})", is_error=True)
            self.runtime.start_run(child, prompt, parent_run=run)
        if child not in run.children:
            run.children.append(child)
        if child.run is not None and child.run.task is not None:
            return await asyncio.shield(child.run.task)
        return self.runtime.settled_result(child)

    # ---- completion gate ---------------------------------------------------------------------

    async def _completion_gate(self, handle: Handle, run: Run, text: str) -> str | None:
        """None when the final answer is accepted, else the reason it was not."""
        gate = handle.agent.completion
        pattern = gate.pattern
        if pattern is not None and not pattern.search(text):
            return f"the answer does not match {gate.must_match!r}"
        if gate.judge_agent:
            task = next((m.content for m in reversed(handle.transcript[: run.transcript_mark + 1]) if m.role == "user"), "")
            verdict = await self.run_child(
                handle, run, key=f"judge_turn_{handle.turns}", agent_name=gate.judge_agent, prompt=prompts.judge_prompt(task, text)
            )
            verdict_text = verdict.output if isinstance(verdict, ToolResult) else verdict.text
            if not verdict_text.strip().startswith("PASS"):
                return f"the judge {gate.judge_agent!r} said: {verdict_text.strip() or '(nothing)'}"
        return None
