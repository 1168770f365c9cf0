"""Typed results (docs/typed-results.md): an agent with an `output_schema` answers JSON that
matches it. The provider is asked for it natively, but the runtime judges the answer itself:
one that does not parse or match, or holds what no client can be sent (carriable.py), goes back
to the model with the reason, as an attempt of the completion gate. The schema is applied where
its cost is bounded (schema_checks.py)."""

from __future__ import annotations

import json
from typing import Any

from ..definitions import carriable, schemas
from ..definitions.schema_checks import schema_problem
from ..errors import shown
from ..ports import SchemaJudge
from ..vocabulary import AgentSpec

# The attempts of an agent with an output schema whose completion gate sets none: a model that
# gets one field wrong is told, twice, before its run stops.
DEFAULT_ATTEMPTS = 3


def attempts(agent: AgentSpec) -> int:
    """The answers a run may give before it stops at LIMIT_COMPLETION."""
    if agent.completion.max_attempts > 0:
        return agent.completion.max_attempts
    return DEFAULT_ATTEMPTS if agent.output_schema is not None else 1


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse(text: str) -> Any:
    """The answer's JSON value; ValueError (its message for the model) when it is not JSON."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


class OutputSchemas:
    """Each agent's output schema, compiled once (an agent's definition never changes)."""

    def __init__(self, judge: SchemaJudge | None, tenant: str) -> None:
        self.judge = judge
        self.tenant = tenant
        self._compiled: dict[str, schemas.ArgumentsSchema] = {}

    async def judge_answer(self, agent: AgentSpec, text: str) -> tuple[Any, str | None]:
        """The answer's value and why it fails the agent's schema (None: it matches)."""
        assert agent.output_schema is not None
        try:
            value = parse(text)
        except ValueError as exc:
            return None, f"the answer must be JSON matching the output schema, and it is not JSON ({shown(str(exc), 200)})"
        wrong = carriable.problem(value, text)
        if wrong is not None:
            return None, f"the answer must be JSON every client can read, and it is not: {shown(wrong, 200)}"
        validator = self._compiled.get(agent.name)
        if validator is None:
            validator = self._compiled[agent.name] = schemas.compiled(agent.output_schema)
        try:
            problem = await schema_problem(self.judge, self.tenant, validator, value, text)
        except schemas.CheckNotDone as exc:
            return None, f"the output schema could not be applied to the answer: {shown(str(exc), 200)}"
        except schemas.VALIDATION_FAULTS as exc:
            return None, f"the output schema could not be applied ({type(exc).__name__})"
        if problem is not None:
            return None, f"the answer does not match the output schema: {shown(problem, 300)}"
        return value, None
