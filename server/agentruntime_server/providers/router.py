"""Chooses the provider per agent: a scripted agent always runs on the scripted model;
any other runs on the provider its AgentDef names, or the server's default."""

from __future__ import annotations

from collections.abc import Mapping

from ..domain.ports import ModelProvider, ModelReply, ModelRequest, ProviderError, ReplyBound
from ..domain.vocabulary import AgentSpec, Failure, FailureReason
from .scripted import ScriptedProvider


class ProviderRouter:
    def __init__(self, providers: Mapping[str, ModelProvider], default: str, scripted: ScriptedProvider) -> None:
        if default not in providers:
            raise ValueError(f"default provider {default!r} is not one of {sorted(providers)}")
        self.providers = dict(providers)
        self.default = default
        self.scripted = scripted

    @property
    def names(self) -> frozenset[str]:
        """The provider names an AgentDef may give."""
        return frozenset(self.providers)

    def provider_name(self, agent: AgentSpec) -> str:
        return "scripted" if agent.script else agent.provider or self.default

    def reply_bound(self, agent: AgentSpec) -> ReplyBound | None:
        if agent.script:
            return None
        provider = self.providers.get(self.provider_name(agent))
        return provider.reply_bound(agent) if provider is not None else None

    async def complete(self, request: ModelRequest) -> ModelReply:
        if request.agent.script:
            return await self.scripted.complete(request)
        name = self.provider_name(request.agent)
        provider = self.providers.get(name)
        if provider is None:
            # Only a runtime stored by a server configured differently gets here: CreateRuntime refuses it.
            raise ProviderError(
                f"provider {name!r} is not configured on this server; it has {sorted(self.providers)}",
                Failure(FailureReason.PROVIDER_BAD_REQUEST, provider=name, detail="not configured on this server"),
            )
        return await provider.complete(request)
