"""A handle's counters as one value: what a host bills from and budgets check.

Tokens are kept as the providers bill them (`Tokens`: input at the base rate, cache reads,
cache writes, output, and the reasoning part of output), and what they cost (`Cost`: an
integer count of micro-units, rounded once per reply). `own_tokens` and `total_tokens` are
the split's totals, kept as plain figures too: budgets, quotas and the wire read them.

Named tuples, not dataclasses: immutable values built on every model reply for the handle
and each ancestor, and journaled with it. A frozen dataclass of these fields took 6.6 µs a
reply to update and 819 bytes to journal; these take a third of that (docs/performance.md)."""

from __future__ import annotations

from typing import NamedTuple, NoReturn, TypeVar


class Tokens(NamedTuple):
    input: int = 0  # input billed at the base rate (neither read from nor written to a cache)
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0  # reasoning included
    reasoning: int = 0  # the part of output spent thinking (not added to the total again)

    @property
    def total(self) -> int:
        return self.input + self.cache_read + self.cache_write + self.output

    def __add__(self, other: object) -> NoReturn:
        raise TypeError("a tuple's + would concatenate: use plus()")

    def plus(self, other: Tokens) -> Tokens:
        return _new(
            Tokens,
            (
                self.input + other.input,
                self.cache_read + other.cache_read,
                self.cache_write + other.cache_write,
                self.output + other.output,
                self.reasoning + other.reasoning,
            ),
        )


class Cost(NamedTuple):
    """Micro-units of `currency` (1,500,000 micros of USD: $1.50). `priced`: every call it
    covers had a price (nothing to price counts as priced: an idle handle costs nothing)."""

    micros: int = 0
    currency: str = ""
    priced: bool = True

    def __add__(self, other: object) -> NoReturn:
        raise TypeError("a tuple's + would concatenate: use plus()")

    def plus(self, other: Cost) -> Cost:
        # Sums in two currencies are not one amount: the first currency stays and the sum says it is incomplete.
        currency = self.currency or other.currency
        mixed = bool(self.currency and other.currency and self.currency != other.currency)
        return _new(Cost, (self.micros + other.micros, currency, self.priced and other.priced and not mixed))


_Value = TypeVar("_Value", "Tokens", "Cost", "Usage")
UNPRICED = Cost(priced=False)  # a call no price covers
NO_TOKENS = Tokens()
NO_COST = Cost()


class Usage(NamedTuple):
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

    def __add__(self, other: object) -> NoReturn:
        raise TypeError("a tuple's + would concatenate: use plus()")

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
        total = tokens.total
        return _new(
            Usage,
            (
                self.turns + 1,
                self.own_tokens + total,
                self.total_tokens + total,
                self.tool_calls,
                self.subtree_tool_calls,
                self.own_split.plus(tokens),
                self.total_split.plus(tokens),
                self.own_cost.plus(cost),
                self.total_cost.plus(cost),
                self.own_estimated or estimated,
                self.total_estimated or estimated,
            ),
        )

    def after_descendant_reply(self, tokens: Tokens, cost: Cost = NO_COST, estimated: bool = False) -> Usage:
        """An ancestor of the handle that made a model call: only its subtree's figures grow."""
        return _new(
            Usage,
            (
                self.turns,
                self.own_tokens,
                self.total_tokens + tokens.total,
                self.tool_calls,
                self.subtree_tool_calls,
                self.own_split,
                self.total_split.plus(tokens),
                self.own_cost,
                self.total_cost.plus(cost),
                self.own_estimated,
                self.total_estimated or estimated,
            ),
        )

    def after_call(self) -> Usage:
        return self._calls(self.tool_calls + 1, self.subtree_tool_calls + 1)

    def after_descendant_call(self) -> Usage:
        return self._calls(self.tool_calls, self.subtree_tool_calls + 1)

    def _calls(self, tool_calls: int, subtree_tool_calls: int) -> Usage:
        return _new(Usage, (*self[:3], tool_calls, subtree_tool_calls, *self[5:]))


def _new(kind: type[_Value], values: tuple[object, ...]) -> _Value:
    """A named tuple from values in field order, without the argument parsing of its
    constructor (a third of the time): the hot path of every model reply."""
    return tuple.__new__(kind, values)
