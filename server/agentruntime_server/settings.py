"""One settings model: flags override AGENTRUNTIME_* environment variables, which override defaults."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .process.event_loop import DEFAULT_LOOP, EventLoopKind

KIB = 1024
MIB = 1024 * KIB

# A shared server's quotas per tenant (AUTH=tokens or jwt) when AGENTRUNTIME_QUOTA_* leaves
# them unset; with AUTH=none (one trusted caller) none is set. The tokens file overrides them
# per tenant.
SHARED_QUOTAS = {
    "runtimes": 1000,
    "running_handles": 64,
    "handles_per_minute": 600,
    "store_bytes": 1 << 30,  # 1 GiB
    "tokens_per_day": 0,  # what a model costs is the operator's to bound
    "cost_per_day": 0,
    "watch_streams": 100,
    "worker_streams": 100,
}

ProviderStyle = Literal["scripted", "openai", "anthropic"]


def _key_on_one_line(value: SecretStr) -> SecretStr:
    """A key goes in a header: a line break or a NUL in it (a key file's last newline, say)
    cannot, and is refused at start rather than at every model call."""
    if re.search(r"[\r\n\0]", value.get_secret_value()):
        raise ValueError("the key holds a line break or a NUL (a key file's trailing newline?); remove it")
    return value


PROVIDER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# Used when a provider's base_url or model is left empty.
STYLE_BASE_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com/v1", "scripted": ""}
STYLE_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5", "scripted": ""}


class StartupError(Exception):
    """The server cannot start as configured (a bad TLS or auth file, an insecure exposure):
    `agentruntime serve` prints the message on one line and exits 2, without a traceback.
    The message names the setting and the file, never a file's content."""


class ProviderSettings(BaseModel):
    """One named model provider (an entry of AGENTRUNTIME_PROVIDERS)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # inputs hold keys

    style: ProviderStyle = Field(default="openai", description="wire protocol: openai (chat/completions) or anthropic (messages)")
    base_url: str = Field(default="", description="API base URL; empty: the style's public endpoint")
    api_key: SecretStr = Field(default=SecretStr(""), description="provider key; never logged")
    model: str = Field(default="", description="model used when an AgentDef names none; empty: the style's default")
    timeout: float | None = Field(default=None, gt=0, description="seconds one attempt may take; unset: AGENTRUNTIME_LLM_TIMEOUT")
    max_output_tokens: int = Field(default=4096, ge=1, description="anthropic's required max_tokens for each reply")

    _check_key = field_validator("api_key")(_key_on_one_line)

    @property
    def url(self) -> str:
        return self.base_url or STYLE_BASE_URLS[self.style]

    @property
    def default_model(self) -> str:
        return self.model or STYLE_MODELS[self.style]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTRUNTIME_", extra="ignore", hide_input_in_errors=True)

    listen: str = Field("127.0.0.1:50051", description="host:port to serve gRPC on")
    # The LLM_* fields define the provider named after its style (the default provider
    # unless DEFAULT_PROVIDER says otherwise); PROVIDERS adds more, each by name.
    llm_style: ProviderStyle = Field("scripted", description="the style (and name) of the provider LLM_* define")
    llm_base_url: str = Field("", description="its API base URL; empty: the style's public endpoint")
    llm_api_key: SecretStr = Field(SecretStr(""), description="its key; never logged")
    llm_model: str = Field("", description="its model when an AgentDef names none; empty: the style's default")
    llm_timeout: float = Field(120.0, gt=0, description="seconds one model call attempt may take (every provider's default)")
    llm_max_retries: int = Field(4, ge=0, description="retries of a model call after a 429, a 5xx, a timeout or a lost link")
    llm_backoff_base: float = Field(0.5, ge=0, description="seconds: the first retry waits up to this, doubling each retry")
    llm_backoff_max: float = Field(30.0, ge=0, description="seconds: the longest wait between retries, Retry-After included")
    providers: dict[str, ProviderSettings] = Field(default_factory=dict, description="named providers (JSON)")
    default_provider: str = Field("", description="provider of agents that name none; empty: the LLM_STYLE one")
    max_concurrent_model_calls: int = Field(64, ge=1, description="HTTP model calls in flight at once, over all providers")
    http_pool_size: int = Field(256, ge=1, description="keep-alive connections for model calls, and as many for http tools")
    inbox_capacity: int = Field(100, ge=1, description="messages a handle's inbox holds before Post is refused")
    # ---- limits and hardening (docs/limits.md) ----
    max_message_bytes: int = Field(
        4 * MIB, ge=256 * KIB, le=64 * MIB, description="largest gRPC request the server accepts and reply it sends"
    )
    max_text_bytes: int = Field(
        256 * KIB,
        ge=1 * KIB,
        le=1 * MIB,
        description="largest Post text, Wake prompt, Resume output/data and tool output (an http tool's body)",
    )
    max_inbox_bytes: int = Field(1 * MIB, ge=1 * KIB, le=2 * MIB, description="text one inbox holds before Post is refused")
    max_model_reply_bytes: int = Field(
        1 * MIB, ge=64 * KIB, le=2 * MIB, description="largest model API reply body; a larger one is a provider fault"
    )
    max_handles: int = Field(10_000, ge=1, description="handles one runtime may have; past it Spawn and task are refused")
    schema_check_seconds: float = Field(
        2.0,
        ge=0.01,
        le=60,
        description="seconds a schema check off the event loop may take (a typed answer, tool arguments); then it is refused",
    )
    schema_check_workers: int = Field(
        2, ge=1, le=16, description="processes that run the schema checks too costly for the event loop"
    )
    # ---- tenants: quotas (0: none; unset: the mode's default, SHARED_QUOTAS with AUTH on) and retention ----
    quota_runtimes: int | None = Field(None, ge=0, description="runtimes one tenant may keep (DeleteRuntime frees one)")
    quota_running_handles: int | None = Field(
        None, ge=0, description="handles of one tenant working at once, delegated children included (the rest QUEUED)"
    )
    quota_handles_per_minute: int | None = Field(
        None, ge=0, description="handles one tenant may create in any minute (Spawn and task delegation)"
    )
    quota_store_bytes: int | None = Field(
        None, ge=0, description="bytes one tenant's runtimes may take in the store (definitions and journals)"
    )
    quota_tokens_per_day: int | None = Field(None, ge=0, description="model tokens one tenant may spend in any 24 hours")
    quota_cost_per_day: int | None = Field(
        None,
        ge=0,
        description="what one tenant's model calls may cost in any 24 hours, in micro-units of the price table's currency",
    )
    quota_watch_streams: int | None = Field(
        None, ge=0, description="Watch streams one tenant may have open at once on this process (the console's live pages too)"
    )
    quota_worker_streams: int | None = Field(
        None, ge=0, description="ServeTools streams (registered workers) one tenant may have open at once on this process"
    )
    retention: float = Field(
        30 * 86400.0,
        ge=0,
        description="seconds: runtimes with no handle running or suspended, not written for this long, are deleted; 0: never",
    )
    suspended_retention: float = Field(
        0.0,
        ge=0,
        description="seconds: runtimes waiting on a host (a handle SUSPENDED, none running), not written for this long,"
        " are deleted; 0: never",
    )
    request_id_ttl: float = Field(
        86400.0, ge=60, le=30 * 86400, description="seconds a call's request id answers its repeats with its first answer"
    )
    request_ids_kept: int = Field(
        1000, ge=10, le=100_000, description="answers of calls with request ids one runtime keeps (the oldest go first)"
    )
    prices: str = Field(
        "",
        description="path of the JSON file holding the price table per provider and model (docs/configuration.md#prices);"
        " re-read when it changes; empty: nothing is priced",
    )
    test_kill_after_commit: list[str] = Field(
        default_factory=list,
        description="testing only: RPC names whose server process SIGKILLs itself once their effect is committed,"
        " before the answer leaves (a fault point for tests of retries)",
    )
    # The built-in ranges (tools/egress.py) apply whatever these say; docs/security.md#egress.
    tool_egress_allow: list[str] = Field(
        default_factory=list,
        description="networks (CIDR) http tools and MCP servers may reach; empty: any address not refused. "
        "An entry inside a built-in protected range (127.0.0.1/32, 10.1.2.0/24) opens it",
    )
    tool_egress_deny: list[str] = Field(
        default_factory=list,
        description="networks (CIDR) http tools and MCP servers may never reach, over the built-in ones; wins over ALLOW",
    )
    store: str = Field(
        "sqlite:///agentruntime.db",
        pattern=r"^(memory://|sqlite:///.+|postgres(ql)?://.+)$",
        description="sqlite:///relative/path.db, sqlite:////absolute/path.db, "
        "postgresql://user:password@host:port/db, or memory:// (nothing survives)",
    )
    # ---- replicas (docs/replicas.md): only with a postgresql:// store ----
    advertise: str = Field(
        "",
        pattern=r"^(|[A-Za-z0-9_.-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5})$",
        description="host:port other replicas reach this one at; empty: the listen address (127.0.0.1 for a wildcard host)",
    )
    lease_duration: float = Field(
        10.0, ge=1.0, le=600.0, description="seconds a dead replica keeps its runtimes before the others take them over"
    )
    replica_ca: str = Field(
        "", description="PEM CA certificates verifying other replicas' certificates (forwarded calls); empty: system roots"
    )
    watch_buffer: int = Field(
        1000,
        ge=1,
        description="events a Watch consumer may fall behind (its history page not yet sent, its live queue)"
        " before it must reconnect",
    )
    stream_replies: Literal["watched", "always"] = Field(
        "watched",
        description="which model replies stream (docs/streaming.md): those of turns that start while someone watches"
        " their runtime with deltas, or always",
    )
    runtime_cache: int = Field(1000, ge=1, description="idle runtimes kept in memory; the rest are reloaded from the store")
    shutdown_grace: float = Field(10.0, ge=0, description="seconds running turns get to reach a journal point at SIGTERM")
    log_level: str = Field("INFO")
    event_loop: EventLoopKind = Field(DEFAULT_LOOP, description="uvloop (libuv) or asyncio (the standard library's)")
    log_format: Literal["text", "json"] = Field("text", description="text (for people) or json (one object a line)")
    metrics_listen: str = Field(
        "127.0.0.1:9464",
        pattern=r"^(|off|\[?[A-Za-z0-9_.:-]*\]?:[0-9]{1,5})$",
        description="host:port to serve Prometheus /metrics on; empty or 'off': no metrics",
    )
    otel_endpoint: str = Field(
        "", description="OTLP/gRPC collector for traces; empty: OTEL_EXPORTER_OTLP_ENDPOINT if set, else no tracing"
    )
    # ---- transport security and authentication (docs/security.md) ----
    tls_cert: str = Field("", description="PEM certificate chain to serve TLS with (with TLS_KEY); empty: plaintext")
    tls_key: str = Field("", description="PEM private key of TLS_CERT, unencrypted; read at start, never logged")
    tls_client_ca: str = Field(
        "", description="PEM CA certificates: clients must present a certificate one of them signed (mTLS); empty: none asked"
    )
    auth: Literal["none", "tokens", "jwt"] = Field(
        "none",
        description="none: every caller is tenant 'default'; tokens: bearer tokens listed in AUTH_TOKENS_FILE; "
        "jwt: bearer JWTs verified with AUTH_JWKS",
    )
    auth_tokens_file: str = Field(
        "", description="JSON list of {tenant, token_sha256, scopes, name}; re-read when it changes (AUTH=tokens)"
    )
    auth_jwks: str = Field("", description="the JWKS verifying JWTs: an http(s) URL (cached) or a file path (AUTH=jwt)")
    auth_issuer: str = Field("", description="the 'iss' every JWT must carry (AUTH=jwt)")
    auth_audience: str = Field("", description="the 'aud' every JWT must carry (AUTH=jwt)")
    auth_tenant_claim: str = Field("tenant", min_length=1, description="the JWT claim naming the caller's tenant (AUTH=jwt)")
    allow_insecure: bool = Field(
        False, description="serve a non-loopback address in plaintext with AUTH=none (anyone reaching the port is 'default')"
    )

    _check_key = field_validator("llm_api_key")(_key_on_one_line)

    @field_validator("tool_egress_allow", "tool_egress_deny")
    @classmethod
    def _check_egress_networks(cls, value: list[str]) -> list[str]:
        from .tools.egress import parse_networks  # raises ValueError naming the bad entry

        parse_networks(value)
        return value

    @model_validator(mode="after")
    def _check_providers(self) -> Settings:
        for name in self.providers:
            if not PROVIDER_NAME.fullmatch(name):
                raise ValueError(f"AGENTRUNTIME_PROVIDERS: {name!r} is not a provider name (letters, digits, '_', '-', '.')")
            if name in ("scripted", self.llm_style):
                raise ValueError(
                    f"AGENTRUNTIME_PROVIDERS defines {name!r}, which "
                    + ("is built in" if name == "scripted" else "AGENTRUNTIME_LLM_* already define (LLM_STYLE)")
                    + "; choose another name"
                )
        known = self.provider_table()
        if self.default_name not in known:
            raise ValueError(f"AGENTRUNTIME_DEFAULT_PROVIDER {self.default_name!r} is not a provider; known: {sorted(known)}")
        return self

    def quota(self, name: str) -> int:
        """A quota of every tenant (0: none): as set, or unset, the mode's default."""
        value: int | None = getattr(self, f"quota_{name}")
        if value is not None:
            return value
        return SHARED_QUOTAS.get(name, 0) if self.auth != "none" else 0

    @property
    def default_name(self) -> str:
        return self.default_provider or self.llm_style

    def provider_table(self) -> dict[str, ProviderSettings]:
        """Every provider by name: the built-in scripted one, the LLM_* one, and PROVIDERS."""
        table = {"scripted": ProviderSettings(style="scripted")}
        table[self.llm_style] = ProviderSettings(
            style=self.llm_style,
            base_url=self.llm_base_url,
            api_key=self.llm_api_key,
            model=self.llm_model,
            timeout=self.llm_timeout,
        )
        table.update(self.providers)
        return table
