"""Builds the named providers the settings describe."""

from __future__ import annotations

from ..domain.fifo_gate import FifoGate
from ..domain.ports import ModelProvider
from ..http import HttpClient
from ..settings import Settings
from .anthropic import AnthropicProvider
from .base import CallPolicy
from .openai import OpenAIProvider
from .router import ProviderRouter
from .scripted import ScriptedProvider


def build_router(settings: Settings, http: HttpClient) -> ProviderRouter:
    scripted = ScriptedProvider()
    policy = CallPolicy(
        gate=FifoGate(settings.max_concurrent_model_calls),
        max_reply_bytes=settings.max_model_reply_bytes,
        max_retries=settings.llm_max_retries,
        backoff_base=settings.llm_backoff_base,
        backoff_max=settings.llm_backoff_max,
    )
    providers: dict[str, ModelProvider] = {}
    for name, config in settings.provider_table().items():
        timeout = config.timeout or settings.llm_timeout
        api_key = config.api_key.get_secret_value()
        if config.style == "scripted":
            providers[name] = scripted
        elif config.style == "anthropic":
            providers[name] = AnthropicProvider(
                http,
                name=name,
                base_url=config.url,
                api_key=api_key,
                default_model=config.default_model,
                timeout=timeout,
                policy=policy,
                max_output_tokens=config.max_output_tokens,
            )
        else:
            providers[name] = OpenAIProvider(
                http,
                name=name,
                base_url=config.url,
                api_key=api_key,
                default_model=config.default_model,
                timeout=timeout,
                policy=policy,
            )
    return ProviderRouter(providers, settings.default_name, scripted)
