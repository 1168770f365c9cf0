"""The seams the domain calls through: models, tools, persistence. Implementations live
in providers/, tools/ and store/; the domain never imports them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from .billing.prices import Price
from .billing.usage import UNPRICED, Cost, Tokens
from .clock import SYSTEM_CLOCK, Clock
from .journal import Entry
from .journal.events import Observer
from .journal.tree import RuntimeCounts
from .limits import Limits, Quotas
from .ownership import Claim, SoleOwner
from .vocabulary import (
    AgentSpec,
    Answer,
    Failure,
    HttpExecutor,
    McpExecutor,
    McpServerSpec,
    Message,
    ReplyStop,
    Thinking,
    ToolCall,
    ToolResult,
    ToolSuspension,
    WorkerExecutor,
)


class ProviderError(Exception):
    """A model call failed; the run settles ERROR with this message (never a secret) and
    this failure."""

    def __init__(self, message: str, failure: Failure) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass(frozen=True)
class ToolSchema:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    agent: AgentSpec
    messages: tuple[Message, ...]  # the system prompt first when the agent has instructions
    tools: tuple[ToolSchema, ...]
    # The handle's prompt-cache key when its agent asks for prompt caching (`prompt_cache`):
    # stable across its turns, different for each handle; "" otherwise.
    cache_key: str = ""
    # Where the reply's pieces go as they arrive, while someone watches with deltas
    # (docs/streaming.md); None: the reply is read whole.
    stream: ReplyStream | None = None


class ReplyStream(Protocol):
    """A model turn's stream (domain/watching/deltas.py): what a provider hands over as a reply
    arrives. Called on the event loop; quick, never raises. Empty pieces are ignored."""

    @property
    def streamed(self) -> bool:
        """Something was handed over since the stream (re)started."""
        ...

    def text(self, piece: str) -> None: ...

    def thinking(self, piece: str) -> None: ...

    def tool_call(self, index: int, name: str, arguments: str) -> None:
        """A piece of the reply's tool call at `index` (from 0): its name in its first piece."""

    def restart(self, reason: str) -> None:
        """What was handed over is void (`retry`: the call is made again): a reset."""


@dataclass(frozen=True)
class ModelReply:
    text: str
    tool_calls: tuple[ToolCall, ...]  # ids are the provider's; the domain assigns its own
    usage: Tokens | None  # None: the provider reported no usage (the runtime estimates it)
    stop: ReplyStop = ReplyStop.COMPLETE
    thinking: tuple[Thinking, ...] = ()
    model: str = ""  # the model the request named (the price table's key, with the provider's name)


class PriceSource(Protocol):
    """What a reply costs, at the prices in force now (AGENTRUNTIME_PRICES)."""

    def cost(self, provider: str, model: str, tokens: Tokens) -> Cost: ...

    def price(self, provider: str, model: str) -> Price | None:
        """The model's prices now (None: no price covers it); a turn's reservation is priced so."""
        ...


class NoPrices:
    """No price table: every call costs nothing, and says it was not priced."""

    def cost(self, provider: str, model: str, tokens: Tokens) -> Cost:
        return UNPRICED

    def price(self, provider: str, model: str) -> Price | None:
        return None


class ReplyBound(NamedTuple):
    """What bounds a reply of an agent's model, for the reservation made before its turn
    (domain/runs/reservations.py): the model the request names (the price table's key, with the
    provider's name) and the most output tokens a reply may have (None: the provider is sent
    no cap, so none is known)."""

    model: str
    output_cap: int | None


class ModelProvider(Protocol):
    async def complete(self, request: ModelRequest) -> ModelReply: ...

    def reply_bound(self, agent: AgentSpec) -> ReplyBound | None:
        """None: its turns reserve nothing (the embedded scripted model: its figures are its script's)."""
        ...


class ModelRouter(ModelProvider, Protocol):
    """The provider the runtime calls: it routes each agent to a named provider."""

    def provider_name(self, agent: AgentSpec) -> str:
        """The name of the provider that answers this agent (in failures)."""
        ...

    @property
    def names(self) -> frozenset[str]:
        """Every provider name an AgentDef may give."""
        ...


class CallInDoubt(Exception):
    """An attempt of a call was cut off once its request may have reached the tool (the
    connection was lost, or the deadline passed, after the request was sent): the call may or
    may not have taken effect. The text says how, and is shown to the model and the host."""


class CallNotSent(Exception):
    """An attempt of a call reached nothing (no connection, or one lost before any byte of the
    request was sent): the tool cannot have acted on it. The text is the error result the
    model is shown, unless an earlier attempt of the call was cut off (CallInDoubt)."""


class HttpToolRunner(Protocol):
    async def run(
        self, executor: HttpExecutor, arguments_json: str, idempotency_key: str, answer: Answer | None = None
    ) -> ToolResult | ToolSuspension:
        """One attempt: the call's result, or the Request it suspends on (HTTP 202); raises
        CallInDoubt or CallNotSent when no answer came. `answer`: the host's answer to the
        Request the previous attempt of this call suspended on."""
        ...


class WorkerLost(Exception):
    """The worker running a call went away, or kept it past its deadline: the call may or
    may not have taken effect (it is in doubt)."""

    def __init__(self, message: str, worker_id: str = "") -> None:
        super().__init__(message)
        self.worker_id = worker_id


class WorkerToolRunner(Protocol):
    async def run(
        self,
        tenant: str,
        executor: WorkerExecutor,
        call: ToolCall,
        key: str,
        runtime_id: str,
        handle_id: str,
        lost: Sequence[str] = (),
    ) -> ToolResult:
        """The output of a worker serving the executor's queue (of the tenant); an error
        result when no worker took the call within its timeout (one that says the call is in
        doubt when a worker took it before: `lost` names the workers whose WorkerLost this
        attempt follows); WorkerLost when the worker that took it did not answer (it may have
        run it)."""
        ...


@dataclass(frozen=True)
class Dispatch:
    """A call on its way to a worker (the WorkerToolRunner hands it to the host serving its queue):
    what the edge sends as a WorkerCall."""

    id: str
    call: ToolCall
    key: str
    runtime_id: str
    handle_id: str
    deadline: float  # time.time()


class NoWorkers:
    """A runtime with no ServeTools edge (tests of the domain): nobody serves any queue."""

    async def run(
        self,
        tenant: str,
        executor: WorkerExecutor,
        call: ToolCall,
        key: str,
        runtime_id: str,
        handle_id: str,
        lost: Sequence[str] = (),
    ) -> ToolResult:
        return ToolResult(f"no worker serves queue {executor.queue!r}", is_error=True)


@dataclass(frozen=True)
class McpTool:
    """A tool an MCP server lists."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None  # what its structuredContent must match


@dataclass(frozen=True)
class StructuredContent:
    """An MCP tool's structured content, for a tool that listed an output schema: the domain
    checks it against that schema (schema_checks.py) before the model reads its JSON text."""

    server: str
    value: Any
    text: str  # its JSON, as the model reads it


class McpError(Exception):
    """An MCP server could not be reached or answered wrongly; the message never holds a secret."""


class McpClient(Protocol):
    async def list_tools(self, server: McpServerSpec) -> list[McpTool]:
        """Every tool the server lists (McpError if it cannot be had)."""
        ...

    async def call(self, executor: McpExecutor, arguments: dict[str, Any], key: str) -> ToolResult | StructuredContent:
        """The call's result (`tools/call`, the idempotency key in `_meta`); a server that
        cannot be reached or fails gives an error result. A tool with an output schema that
        answers with structured content gives it unjudged."""
        ...


class NoMcp:
    """No MCP client (tests of the domain): no server can be reached."""

    async def list_tools(self, server: McpServerSpec) -> list[McpTool]:
        raise McpError("this server reaches no MCP server")

    async def call(self, executor: McpExecutor, arguments: dict[str, Any], key: str) -> ToolResult:
        return ToolResult("this server reaches no MCP server", is_error=True)


class UrlPolicy(Protocol):
    def url_refusal(self, url: str) -> str | None:
        """Why no connection may be made to `url` whatever DNS answers (its host is an IP
        literal the egress policy refuses), or None. Checked at CreateRuntime for every URL a
        definition makes the server connect to; host names are judged when resolved."""
        ...


class AnyUrl:
    """No egress policy (tests of the domain): every URL may be tried."""

    def url_refusal(self, url: str) -> str | None:
        return None


class SchemaJudge(Protocol):
    async def problem(self, tenant: str, schema: str, instance: str) -> str | None:
        """Why `instance` (JSON text) fails `schema` (the JSON text of a schema the definitions
        check accepted): jsonschema's best match, or None when it matches, judged off the event
        loop (process/schema_judges.py). Raises CheckNotDone with the reason when it could not
        judge (its time budget spent, the schema not applicable)."""
        ...


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


@dataclass(frozen=True)
class RuntimeRow:
    runtime_id: str  # the store's key
    tenant: str
    created_at: float
    counts: RuntimeCounts


@dataclass(frozen=True)
class TenantReply:
    """The answer to a CreateRuntime or a DeleteRuntime made with a request id, kept per tenant
    (the runtime it names may not exist yet, or no more): `scope` is "" for CreateRuntime and
    the deleted runtime's id for DeleteRuntime; `runtime_id` is the tenant's id of the runtime
    the call created or deleted."""

    tenant: str
    scope: str
    request_id: str
    rpc: str
    digest: str
    runtime_id: str
    at: float


@dataclass
class StoredRuntime:
    agents: tuple[AgentSpec, ...]
    entries: list[Entry]  # the whole journal, in order


class Store(Protocol):
    """Where the journal goes: the source of truth after a restart.

    The contract is small on purpose (a second backend implements it, and one
    conformance suite, tests/store/test_store_contract.py, holds every backend to it): a runtime
    is its definitions plus its journal, appended in order and read back whole. Appends
    may be grouped into one transaction; `flush` makes everything appended so far durable,
    and runs before an effect leaves the process (an RPC's reply, a watched event, a
    side-effecting tool call)."""

    durable: bool  # False: nothing survives the process, so nothing is evicted from memory

    async def create_runtime(
        self,
        runtime_id: str,
        agents: tuple[AgentSpec, ...],
        tenant: str = "default",
        entries: Sequence[Entry] = (),
        quota: int = 0,
        reply: TenantReply | None = None,
    ) -> None:
        """`runtime_id` is the store's key, unique over every tenant (AlreadyExists).
        `reply`: the call's answer, kept in the same transaction (errors.RequestIdTaken, and
        nothing created, if the tenant's scope holds that request id already).
        `entries`: its first journal entries, seq 1 on, stored with it in one transaction: a
        runtime is never read back without them; appends go on after them. `quota` (0: none):
        QuotaExceeded if the tenant has that many runtimes already, counted and inserted in
        one step against every process sharing the store."""
        ...

    async def runtime_exists(self, runtime_id: str) -> bool: ...

    async def append(
        self,
        runtime_id: str,
        entries: Sequence[Entry],
        running: bool | None = None,
        counts: RuntimeCounts | None = None,
    ) -> None:
        """The entries, after every entry appended before (atomically, in order).
        `running`: whether the runtime now needs a process (None: unchanged); `counts`: its
        figures now, for listings (None: unchanged)."""
        ...

    async def list_runtimes(self, tenant: str, after: tuple[float, str] | None, limit: int) -> list[RuntimeRow]:
        """A tenant's runtimes, newest first, after the (created_at, runtime_id) cursor."""
        ...

    async def delete_runtime(self, runtime_id: str, reply: TenantReply | None = None) -> None:
        """Every stored row of the runtime; and `reply` kept, in the same transaction
        (errors.RequestIdTaken, and nothing deleted, if its scope holds that request id already)."""
        ...

    async def reply(self, tenant: str, scope: str, request_id: str) -> TenantReply | None:
        """The answer kept for a tenant's request id in a scope, if any (however old)."""
        ...

    async def forget_replies_before(self, at: float) -> None:
        """Deletes every tenant's answers kept before `at`. Harmless when run again, or at once."""
        ...

    async def idle_runtimes(self, before: float | None, suspended_before: float | None = None) -> list[str]:
        """The runtimes retention may delete, of every tenant: nothing running (the `running`
        flag of append is false), and not written since `before` if no handle is SUSPENDED,
        or since `suspended_before` if one is (its counts say so). A cutoff of None: that
        kind is never idle."""
        ...

    async def delete_if_idle(self, runtime_id: str, before: float | None, suspended_before: float | None = None) -> bool:
        """Deletes the runtime as delete_runtime does, but only if idle_runtimes would list it
        now, with the same cutoffs: checked and deleted in one step, and an append not yet
        committed counts as a write. A runtime written after a listing is kept. True: it was
        deleted."""
        ...

    async def count_runtimes(self, tenant: str) -> int: ...

    async def tenant_bytes(self, tenant: str) -> int:
        """The bytes the tenant's runtimes take in the store: each one's definitions (their JSON)
        plus its journal's steps (their payloads, store/payloads.py, and whatever framing the
        backend stores them in: SQLite's group rows), as of the last flush, or later. Cheap:
        kept per runtime as it grows, never summed over a journal."""
        ...

    async def add_tokens(self, tenant: str, minute: int, tokens: int, micros: int = 0) -> None:
        """A tenant's model tokens and what they cost (micro-units), counted in a minute
        (written with the tick's journal)."""
        ...

    async def tokens_since(self, tenant: str, minute: int) -> list[tuple[int, int, int]]:
        """A tenant's (minute, tokens, micros) from `minute` on."""
        ...

    async def forget_tokens_before(self, minute: int) -> None:
        """Deletes every tenant's counts of minutes before `minute` (tokens added so far
        included). Harmless when run again, or at once by replicas on one database."""
        ...

    async def load(self, runtime_id: str) -> StoredRuntime | None: ...

    async def entries_after_event(self, runtime_id: str, after_event: int, limit: int | None = None) -> list[Entry]:
        """Every entry that made an event numbered above `after_event`, in order (and the
        entries without events between them); with `limit`, only the first `limit` of them.
        A watcher pages its history so (domain/watching/event_log.py), each page read after the last
        event of the one before; a page costs the same however far into the journal it starts."""
        ...

    async def runtimes_with_running_handles(self) -> list[str]: ...

    async def flush(self, runtime_id: str | None = None) -> None:
        """Everything appended so far is durable. `runtime_id`: and that runtime's writes were
        accepted (errors.Fenced: a store shared by replicas once its lease is lost; PostgreSQL
        also once the runtime's row is gone, deleted by another process)."""
        ...

    def on_health(self, callback: Callable[[bool], None]) -> None:
        """`callback(False)` when the store can take no more writes, `callback(True)` when it
        can again. PostgreSQL: its database went away (errors.StoreUnavailable meanwhile),
        then came back. SQLite: a write failed for want of space or I/O (errors.StoreCannotWrite
        meanwhile), then one went through; or a commit failed past mending, and it takes
        nothing more until the server is restarted (errors.StoreBroken)."""
        ...

    def on_unwritten(self, callback: Callable[[Collection[str]], None]) -> None:
        """`callback(keys)`: the store did not take these runtimes' last writes (a commit that
        failed, an append while it was away): their copies in memory are ahead of it and must
        stop; the store has forgotten whatever else of theirs it still buffered."""
        ...

    async def close(self) -> None: ...


class Leases(Protocol):
    """Which process executes which runtime. One process on its own store owns every runtime
    (ownership.SoleOwner); replicas sharing a database hold a lease per runtime, with a
    fencing epoch the store checks on every journal write (store/pg_leases.py)."""

    shared: bool  # True: other processes may execute runtimes of this store

    async def claim(self, runtime_id: str) -> Claim:
        """Takes the runtime's lease unless a live replica holds it. A claim always starts a
        new epoch: writes of any earlier holder, this process's included, are refused."""
        ...

    async def start(self) -> None:
        """This process takes part from now on (replicas: it is registered, live)."""
        ...

    async def confirm(self) -> None:
        """Makes sure `holds` is current: renews first if the leases may have lapsed."""
        ...

    def holds(self, runtime_id: str) -> bool:
        """This process still holds the runtime's lease, as far as it knows (no I/O)."""
        ...

    async def release(self, runtime_id: str) -> None:
        """Gives the lease up (its journal flushed first); another replica may claim it."""
        ...

    async def release_all(self) -> None:
        """Gives every lease of this process up (a graceful shutdown: no lease lapses)."""
        ...

    async def renew(self) -> list[str]:
        """Keeps this process's leases alive; returns the runtimes it turned out to have lost."""
        ...

    async def orphans(self) -> list[str]:
        """Runtimes with running handles that no live replica holds (a dead one's)."""
        ...

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """`callback(runtime_id)` whenever a write of that runtime is refused (fenced)."""
        ...
