"""The runtime's vocabulary as plain Python values (no proto, no transport)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .billing.usage import Tokens, Usage


class Status(enum.Enum):
    UNSPECIFIED = 0
    DONE = 1
    PENDING = 2
    INCOMPLETE = 3
    INTERRUPTED = 4
    CLOSED = 5
    TIMEOUT = 6
    ERROR = 7


class Limit(enum.Enum):
    NONE = 0
    MAX_TURNS = 1
    MAX_TOKENS = 2
    MAX_TOOL_CALLS = 3
    MAX_WALL_TIME = 4
    MAX_CHILDREN = 5
    MAX_DEPTH = 6
    COMPLETION = 7
    MAX_OUTPUT_TOKENS = 8
    MAX_COST = 9

    @property
    def wire_name(self) -> str:
        return f"LIMIT_{self.name}"


class FailureReason(enum.Enum):
    UNSPECIFIED = 0
    MODEL_REFUSED = 1
    CONTEXT_LENGTH_EXCEEDED = 2
    PROVIDER_AUTH = 3
    PROVIDER_RATE_LIMITED = 4
    PROVIDER_UNAVAILABLE = 5
    PROVIDER_BAD_REQUEST = 6
    PROVIDER_BAD_REPLY = 7
    RUNTIME = 8


@dataclass(frozen=True)
class Failure:
    """Why a run failed, in words a host can branch on (set iff the status is ERROR)."""

    reason: FailureReason
    provider: str = ""
    http_status: int = 0
    retryable: bool = False
    detail: str = ""


class ReplyStop(enum.Enum):
    """How a model reply ended (a scripted reply can say so too)."""

    COMPLETE = 0
    MAX_OUTPUT_TOKENS = 1  # cut off at its output cap
    REFUSAL = 2  # the model declined; the text is its refusal
    PROVIDER_UNAVAILABLE = 3  # scripted only: the call fails as an unavailable provider's would


class HandleState(enum.Enum):
    IDLE = 1
    RUNNING = 2
    SUSPENDED = 3
    CLOSED = 4
    QUEUED = 5  # woken, waiting for a slot (max_concurrent, the runtime's model-call limit)
    HELD = 6  # a fork's run cut at its last recorded step (or answered at the fork): a Wake continues it

    @property
    def in_flight(self) -> bool:
        """A run is under way (or about to be): after a crash it continues from the journal."""
        return self in (HandleState.RUNNING, HandleState.QUEUED)


class Trust(enum.Enum):
    """Who a posted message comes from: how the model is shown it."""

    HOST = 1
    AGENT = 2
    EXTERNAL = 3  # quoted to the model as data, never as instructions


class OnInterrupted(enum.Enum):
    """What recovery does with a tool call that was in flight when the process died."""

    DEFAULT = 0  # RETRY for http and worker tools
    RETRY = 1
    ASK = 2


class GuardrailAction(enum.Enum):
    DENY = 1
    REQUIRE_APPROVAL = 2


class OnExhausted(enum.Enum):
    STOP = 1  # INCOMPLETE with the limit
    ASK = 2  # suspend with a `budget` Request; the host may extend the budget


@dataclass(frozen=True)
class Budget:
    """Every field None means unlimited. Wall time is in seconds. `on_exhausted` None: STOP."""

    max_turns: int | None = None
    max_tokens: int | None = None
    max_tool_calls: int | None = None
    max_wall_time: float | None = None
    max_children: int | None = None
    max_depth: int | None = None
    max_concurrent: int | None = None
    on_exhausted: OnExhausted | None = None
    max_cost: int | None = None  # micro-units of the price table's currency, the subtree's

    @property
    def asks(self) -> bool:
        return self.on_exhausted is OnExhausted.ASK

    def overridden_by(self, other: Budget) -> Budget:
        """Field by field: the other's set fields win."""
        merged = {
            name: getattr(other, name) if getattr(other, name) is not None else getattr(self, name)
            for name in self.__dataclass_fields__
        }
        return Budget(**merged)


@dataclass(frozen=True)
class RuntimeOptions:
    """Per-runtime settings, within the server's (0: the server's own)."""

    inbox_capacity: int = 0
    max_concurrent_model_calls: int = 0


@dataclass(frozen=True)
class HttpExecutor:
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0


@dataclass(frozen=True)
class RelayExecutor:
    pass


@dataclass(frozen=True)
class WorkerExecutor:
    """A host serving `queue` over ServeTools runs the call, inline in the turn."""

    queue: str
    timeout: float = 30.0


@dataclass(frozen=True)
class McpExecutor:
    """A tool of an MCP server, called through `tools/call` (listed at CreateRuntime)."""

    server: str  # the McpServerSpec's name
    url: str
    tool: str  # the tool's name on the server
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    output_schema: dict[str, Any] | None = None  # its structuredContent must match it (docs/typed-results.md)


@dataclass(frozen=True)
class McpServerSpec:
    """A Model Context Protocol server an agent takes tools from (AgentDef.mcp_servers)."""

    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    allowed_tools: tuple[str, ...] = ()
    timeout: float = 30.0


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    executor: HttpExecutor | WorkerExecutor | McpExecutor | RelayExecutor
    approval_required: bool = False
    approval_prompt: str = ""
    on_interrupted: OnInterrupted = OnInterrupted.DEFAULT

    @property
    def asks_when_in_doubt(self) -> bool:
        return self.on_interrupted is OnInterrupted.ASK


@dataclass(frozen=True)
class CompletionGate:
    max_attempts: int = 1
    must_match: str = ""
    judge_agent: str = ""

    @property
    def active(self) -> bool:
        return bool(self.must_match or self.judge_agent)


@dataclass(frozen=True)
class Guardrail:
    tool: str
    action: GuardrailAction
    reason: str


@dataclass(frozen=True)
class ScriptedToolCall:
    name: str
    arguments_json: str


@dataclass(frozen=True)
class ScriptedReply:
    text: str
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    tokens: int = 0  # without `usage`: output tokens
    delay: float = 0.0
    stop: ReplyStop = ReplyStop.COMPLETE
    usage: Tokens | None = None  # the split the reply reports, as a provider's would
    stream_chunk_chars: int = 0  # streamed to delta watchers in pieces this long (0: whole)
    stream_pause: float = 0.0  # seconds between the pieces


@dataclass(frozen=True)
class Heartbeat:
    """Wake an idle handle on a period with a coalesced tick."""

    every: float  # seconds
    prompt: str = "heartbeat"


@dataclass(frozen=True)
class Compaction:
    """Replace older turns in the model's view by a summary when a request grows too large."""

    max_context_tokens: int
    keep_last_turns: int = 2
    summarizer_agent: str = ""


@dataclass(frozen=True)
class AgentSpec:
    name: str
    description: str = ""
    instructions: str = ""
    model: str = ""
    tools: tuple[ToolSpec, ...] = ()
    team: tuple[str, ...] = ()
    budget: Budget = Budget()
    completion: CompletionGate = CompletionGate()
    guardrails: tuple[Guardrail, ...] = ()
    script: tuple[ScriptedReply, ...] = ()
    provider: str = ""  # a provider named in the server's settings; "" = the default
    max_output_tokens: int | None = None  # the output cap sent with each call; None: the provider's
    heartbeat: Heartbeat | None = None
    compaction: Compaction | None = None
    # Listed at CreateRuntime: their tools are in `tools`, named `<server>__<tool>`.
    mcp_servers: tuple[McpServerSpec, ...] = ()
    prompt_cache: bool = False  # ask the provider to cache the prompt's stable prefix
    output_schema: dict[str, Any] | None = None  # the JSON Schema its final answer must match (outputs.py)

    def tool(self, name: str) -> ToolSpec | None:
        for spec in self.tools:
            if spec.name == name:
                return spec
        return None

    def guardrail(self, tool_name: str) -> Guardrail | None:
        for rail in self.guardrails:
            if rail.tool == tool_name:
                return rail
        return None


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class Thinking:
    """A model's reasoning block, kept to be sent back verbatim (Anthropic extended thinking)."""

    text: str = ""
    signature: str = ""
    redacted_data: str = ""  # a redacted block: the encrypted reasoning, opaque


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    is_error: bool = False
    turn: int = 0
    trust: Trust = Trust.HOST  # a user message: the least trusted source it holds
    summary: bool = False  # a compaction summary standing in for older turns (model's view only)
    refusal: bool = False  # an assistant message: the model refused; content is the refusal
    truncated: bool = False  # an assistant message cut off at its output cap: its calls never run
    thinking: tuple[Thinking, ...] = ()


@dataclass(frozen=True)
class ToolResult:
    output: str
    is_error: bool = False


@dataclass(frozen=True)
class PendingRequest:
    id: str
    kind: str
    prompt: str = ""
    url: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    calls: tuple[tuple[ToolCall, str], ...] = ()  # (call, idempotency key)
    expires_at: float | None = None  # seconds since the epoch: the Request lapses then
    from_tool: bool = False  # a running tool asked it (HTTP 202): the answer goes back to the tool


@dataclass(frozen=True)
class ToolSuspension:
    """A tool that needs something only the host can give answered HTTP 202 with this."""

    kind: str
    prompt: str = ""
    url: str = ""
    expires_at: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskResult:
    handle_id: str
    text: str = ""
    is_error: bool = False
    status: Status = Status.UNSPECIFIED
    limit: Limit = Limit.NONE
    pending: PendingRequest | None = None
    usage: Usage = field(default_factory=Usage)  # the handle's figures when the result was read
    failure: Failure | None = None  # set iff the status is ERROR
    output: Any = None  # the answer as JSON data: set iff the agent has an output_schema and the status is DONE
    inherited: Usage | None = None  # in a fork: the subtree's figures at the cut (spent in the source)


@dataclass(frozen=True)
class InboxItem:
    text: str
    channel: str
    sender: str
    trust: Trust = Trust.HOST
    coalesce_key: str = ""
    count: int = 1  # how many posts with its coalesce key it stands for (the latest text kept)


@dataclass(frozen=True)
class HandleSnapshot:
    handle_id: str
    parent_id: str
    agent: str
    state: HandleState
    usage: Usage
    pending_kind: str
    inbox_size: int
    budget: Budget
    last_status: Status
    inherited: Usage | None = None  # in a fork: the subtree's figures at the cut


@dataclass(frozen=True)
class ToolOutput:
    call_id: str
    output: str
    is_error: bool = False


@dataclass(frozen=True)
class Answer:
    id: str
    ok: bool = False
    data: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    outputs: tuple[ToolOutput, ...] = ()


class UnrecordedCalls(enum.Enum):
    """What a replay does with a tool call its recording has no result for."""

    RECORDED_ONLY = 1  # an error result: nothing runs
    LIVE = 2  # the tool runs, with the replay's own idempotency key
    HOST = 3  # the call suspends for the host, as a relay tool's does


@dataclass(frozen=True)
class RecordedCall:
    """A tool call of a recorded run, and its result: a replay answers the same call (the same
    handle, name and arguments, at the same place in the handle's calls) with it."""

    handle_id: str
    place: int  # the call's index among the handle's tool calls, in its transcript's order
    name: str
    arguments_json: str
    result: ToolResult
