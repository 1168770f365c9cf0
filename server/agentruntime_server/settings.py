"""One settings model: flags override AGENTRUNTIME_* environment variables, which override defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTRUNTIME_", extra="ignore")

    listen: str = Field("127.0.0.1:50051", description="host:port to serve gRPC on")
    llm_style: Literal["scripted", "openai"] = Field("scripted", description="the default model provider")
    llm_base_url: str = Field("https://api.openai.com/v1", description="OpenAI-compatible base URL")
    llm_api_key: SecretStr = Field(SecretStr(""), description="provider key; never logged")
    llm_model: str = Field("gpt-4o-mini", description="model used when an AgentDef names none")
    llm_timeout: float = Field(120.0, gt=0, description="seconds a model call may take")
    http_pool_size: int = Field(256, ge=1, description="keep-alive connections shared by model calls and http tools")
    inbox_capacity: int = Field(100, ge=1, description="messages a handle's inbox holds before Post is refused")
    store: str = Field(
        "sqlite:///agentruntime.db",
        pattern=r"^(memory://|sqlite:///.+)$",
        description="sqlite:///relative/path.db, sqlite:////absolute/path.db, or memory:// (nothing survives)",
    )
    runtime_cache: int = Field(1000, ge=1, description="idle runtimes kept in memory; the rest are reloaded from the store")
    shutdown_grace: float = Field(10.0, ge=0, description="seconds running turns get to reach a journal point at SIGTERM")
    log_level: str = Field("INFO")
