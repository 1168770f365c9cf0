"""Checking a value against a caller's schema without holding the event loop.

One process serves every tenant from one event loop, and a schema is a caller's code: the
cost of applying it depends on the schema and on the value (a model's answer, a tool call's
arguments, a third-party MCP server's structured content), all of which a tenant or a third
party controls. A check whose cost has a small bound (schemas.ArgumentsSchema.here) runs on
the loop; any other goes to a judge off the loop (ports.SchemaJudge; the server's runs in
worker processes with a time budget: process/schema_judges.py), and a check that spends the
budget is refused as one that failed."""

from __future__ import annotations

import json
from typing import Any

from ..ports import SchemaJudge
from .schemas import ArgumentsSchema, CheckNotDone, Elsewhere


class JudgeOnTheLoop:
    """Judges in the caller's own thread, whatever it costs: for tests of the domain and for
    embedding, never for a server (the server's judge is process/schema_judges.py)."""

    async def problem(self, tenant: str, schema: str, instance: str) -> str | None:
        try:
            return ArgumentsSchema(json.loads(schema)).problem(json.loads(instance))
        except Exception as exc:
            raise CheckNotDone(type(exc).__name__) from None


async def schema_problem(judge: SchemaJudge | None, tenant: str, schema: ArgumentsSchema, instance: Any, text: str) -> str | None:
    """Why `instance` (parsed from `text`) fails `schema`, or None: on the loop when that is
    cheap, by `judge` otherwise (none: on the loop too). Raises CheckNotDone, or what a schema
    raises while applied (schemas.VALIDATION_FAULTS)."""
    verdict = schema.here(instance, text)
    if isinstance(verdict, Elsewhere):
        return await (judge or JudgeOnTheLoop()).problem(tenant, schema.text, text)
    return verdict
