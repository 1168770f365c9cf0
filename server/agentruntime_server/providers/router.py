"""Chooses the provider per agent: a scripted agent always runs on the scripted model."""

from __future__ import annotations

from ..domain.ports import ModelProvider, ModelReply, ModelRequest
from .scripted import ScriptedProvider


class ProviderRouter:
    def __init__(self, default: ModelProvider, scripted: ScriptedProvider) -> None:
        self.default = default
        self.scripted = scripted

    async def complete(self, request: ModelRequest) -> ModelReply:
        if request.agent.script:
            return await self.scripted.complete(request)
        return await self.default.complete(request)
