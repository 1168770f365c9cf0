"""Definitions decoded once per distinct content: a host creating runtimes of the same agents
sends the same AgentDefs each time, and gets the same decoded tuple back, which the domain then
checks, and the store writes down, once (domain/definitions/same_objects.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from agentruntime.v1 import agent_runtime_pb2 as pb

from ..domain.errors import FieldViolation
from ..domain.vocabulary import AgentSpec
from . import convert

KEPT = 64  # distinct definitions kept decoded
KEPT_BYTES = 64 << 10  # definitions larger than this (encoded) are decoded each time: at most 4 MiB of them kept


class DecodedDefinitions:
    """`decode` is `convert.agents_from_proto`, answered from memory for definitions whose
    encoding (deterministic: a schema's keys in order) was decoded before without a fault.
    Definitions with a fault are decoded again each time: nothing wrong is kept. Each tenant's
    are kept apart: what one tenant sent never comes back faster to another."""

    def __init__(self, kept: int = KEPT, kept_bytes: int = KEPT_BYTES) -> None:
        self._kept = kept
        self._kept_bytes = kept_bytes
        self._decoded: OrderedDict[tuple[str | bytes, ...], tuple[AgentSpec, ...]] = OrderedDict()

    def decode(self, tenant: str, messages: Sequence[pb.AgentDef]) -> tuple[tuple[AgentSpec, ...], list[FieldViolation]]:
        encoded = [message.SerializeToString(deterministic=True) for message in messages]
        key: tuple[str | bytes, ...] = (tenant, *encoded)
        agents = self._decoded.get(key)
        if agents is not None:
            self._decoded.move_to_end(key)
            return agents, []
        agents, found = convert.agents_from_proto(messages)
        if not found and sum(map(len, encoded)) <= self._kept_bytes:
            self._decoded[key] = agents
            if len(self._decoded) > self._kept:
                self._decoded.popitem(last=False)
        return agents, found

    def __len__(self) -> int:
        return len(self._decoded)
