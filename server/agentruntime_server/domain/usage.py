"""A handle's counters as one value: what a host bills from and budgets check.

Tokens are kept as the providers bill them (`Tokens`: input at the base rate, cache reads,
cache writes, output, and the reasoning part of output), and what they cost (`Cost`: an
integer count of micro-units, rounded once per reply). `own_tokens` and `total_tokens` are
the split's totals, kept as plain figures too: budgets, quotas and the wire read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tokens:
    input: int = 0  # input billed at the base rate (neither read from nor written to a cache)
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0  # reasoning included
    reasoning: int = 0  # the part of output spent thinking (not added to the total again)

    @property
    def total(self) -> int:
        return self.input + self.cache_read + self.cache_write + self.output

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.input + other.input,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.output + other.output,
            self.reasoning + other.reasoning,
        )


@dataclass(frozen=True, slots=True)
class Cost:
    """Micro-units of `currency` (1,500,000 micros of USD: $1.50). `priced`: every call it
    covers had a price (nothing to price counts as priced: an idle handle costs nothing)."""

    micros: int = 0
    currency: str = ""
    priced: bool = True

    def __add__(self, other: Cost) -> Cost:
        currency = self.currency or other.currency
        mixed = bool(self.currency and other.currency and self.currency != other.currency)
        return Cost(self.micros + other.micros, currency, self.priced and other.priced and not mixed)


UNPRICED = Cost(priced=False)  # a call no price covers
NO_TOKENS = Tokens()
NO_COST = Cost()


@dataclass(frozen=True, slots=True)
class Usage:
    turns: int = 0  # the handle's own model round trips
    own_tokens: int = 0  # the handle's own spend (own_split.total)
    total_tokens: int = 0  # the spend of the handle's whole subtree (total_split.total)
    tool_calls: int = 0  # the handle's own tool calls (task calls included)
    subtree_tool_calls: int = 0  # the tool calls of the handle's whole subtree (budgets)
    own_split: Tokens = NO_TOKENS
    total_split: Tokens = NO_TOKENS
    own_cost: Cost = NO_COST
    total_cost: Cost = NO_COST
    own_estimated: bool = False  # a reply it covers reported no usage
    total_estimated: bool = False

    @staticmethod
    def unsplit(turns: int, own_tokens: int, total_tokens: int, tool_calls: int, subtree_tool_calls: int = 0) -> Usage:
        """Figures kept before tokens were split (docs/usage.md#older-journals): the tokens read
        as input, their cost as unpriced."""
        return Usage(
            turns,
            own_tokens,
            total_tokens,
            tool_calls,
            subtree_tool_calls,
            Tokens(input=own_tokens),
            Tokens(input=total_tokens),
            UNPRICED if own_tokens else NO_COST,
            UNPRICED if total_tokens else NO_COST,
        )

    def after_reply(self, tokens: Tokens, cost: Cost = NO_COST, estimated: bool = False) -> Usage:
        """The handle that made a model call, after its reply."""
        return Usage(
            self.turns + 1,
            self.own_tokens + tokens.total,
            self.total_tokens + tokens.total,
            self.tool_calls,
            self.subtree_tool_calls,
            self.own_split + tokens,
            self.total_split + tokens,
            self.own_cost + cost,
            self.total_cost + cost,
            self.own_estimated or estimated,
            self.total_estimated or estimated,
        )

    def after_descendant_reply(self, tokens: Tokens, cost: Cost = NO_COST, estimated: bool = False) -> Usage:
        """An ancestor of the handle that made a model call: only its subtree's figures grow."""
        return Usage(
            self.turns,
            self.own_tokens,
            self.total_tokens + tokens.total,
            self.tool_calls,
            self.subtree_tool_calls,
            self.own_split,
            self.total_split + tokens,
            self.own_cost,
            self.total_cost + cost,
            self.own_estimated,
            self.total_estimated or estimated,
        )

    def after_call(self) -> Usage:
        return self._calls(self.tool_calls + 1, self.subtree_tool_calls + 1)

    def after_descendant_call(self) -> Usage:
        return self._calls(self.tool_calls, self.subtree_tool_calls + 1)

    def _calls(self, tool_calls: int, subtree_tool_calls: int) -> Usage:
        return Usage(
            self.turns,
            self.own_tokens,
            self.total_tokens,
            tool_calls,
            subtree_tool_calls,
            self.own_split,
            self.total_split,
            self.own_cost,
            self.total_cost,
            self.own_estimated,
            self.total_estimated,
        )
