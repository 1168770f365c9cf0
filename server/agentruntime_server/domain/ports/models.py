"""The model seam: a request to a model, its reply (streamed or whole), a price source.
Implementations: providers/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..billing.prices import Price
from ..billing.usage import UNPRICED, Cost, Tokens
from ..vocabulary import (
    AgentSpec,
    Failure,
    Message,
    ReplyStop,
    Thinking,
    ToolCall,
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
