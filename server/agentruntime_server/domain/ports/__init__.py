"""The seams the domain calls through: models, tools, persistence (one module each), and
Services, what a runtime is given of them. Implementations live in providers/, tools/, store/
and process/; the domain never imports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..clock import SYSTEM_CLOCK, Clock
from ..journal.events import Observer
from ..limits import Limits, Quotas
from ..ownership import SoleOwner
from .models import (
    ModelProvider,
    ModelReply,
    ModelRequest,
    ModelRouter,
    NoPrices,
    PriceSource,
    ProviderError,
    ReplyBound,
    ReplyStream,
    ToolSchema,
)
from .store import Leases, Origin, RuntimeRow, Store, StoredRuntime, TenantReply
from .tools import (
    AnyUrl,
    CallInDoubt,
    CallNotSent,
    Dispatch,
    HttpToolRunner,
    McpClient,
    McpError,
    McpTool,
    NoMcp,
    NoWorkers,
    SchemaJudge,
    StructuredContent,
    UrlPolicy,
    WorkerLost,
    WorkerToolRunner,
)

__all__ = [
    "AnyUrl",
    "CallInDoubt",
    "CallNotSent",
    "Dispatch",
    "HttpToolRunner",
    "Leases",
    "McpClient",
    "McpError",
    "McpTool",
    "ModelProvider",
    "ModelReply",
    "ModelRequest",
    "ModelRouter",
    "NoMcp",
    "NoPrices",
    "NoWorkers",
    "Origin",
    "PriceSource",
    "ProviderError",
    "ReplyBound",
    "ReplyStream",
    "RuntimeRow",
    "SchemaJudge",
    "Services",
    "Store",
    "StoredRuntime",
    "StructuredContent",
    "TenantReply",
    "ToolSchema",
    "UrlPolicy",
    "WorkerLost",
    "WorkerToolRunner",
]


@dataclass(frozen=True)
class Services:
    """What a runtime needs from outside the domain."""

    models: ModelRouter
    http_tools: HttpToolRunner
    store: Store
    inbox_capacity: int = 100
    limits: Limits = field(default_factory=Limits)
    quotas: Quotas = field(default_factory=Quotas)  # per tenant
    watch_buffer: int = 1000  # events a watcher may fall behind before it is told to reconnect
    observers: tuple[Observer, ...] = ()  # see events.Observer
    leases: Leases = field(default_factory=SoleOwner)  # replicas: who executes which runtime
    workers: WorkerToolRunner = field(default_factory=NoWorkers)  # hosts serving tools over ServeTools
    mcp: McpClient = field(default_factory=NoMcp)  # MCP servers as tool sources
    egress: UrlPolicy = field(default_factory=AnyUrl)  # which URLs a definition may name
    prices: PriceSource = field(default_factory=NoPrices)
    clock: Clock = SYSTEM_CLOCK  # the only time the domain reads (clock.py)
    # Where a schema check whose cost has no small bound runs (definitions/schema_checks.py): off
    # the loop. None (tests of the domain): on the loop, whatever it costs.
    schema_judge: SchemaJudge | None = None
    # Stream every model reply (AGENTRUNTIME_STREAM_REPLIES=always), not only those of turns
    # that start while someone watches their runtime with deltas (docs/streaming.md).
    stream_always: bool = False
