"""What a model reply costs: tokens by the kinds providers bill them at, a price table, and
costs as integer micro-units of one currency (no floats: sums stay exact).

A price is per million tokens, so a token of a kind costs `price` micro-units: a reply's
micros are the sum over kinds of tokens x price, rounded once per reply, half up."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import ClassVar

from .usage import UNPRICED, Cost, Tokens

__all__ = ["NO_PRICES", "UNPRICED", "Cost", "Price", "PriceTable", "Tokens", "micros"]


@dataclass(frozen=True, slots=True)
class Price:
    """The prices per million tokens of one provider's models whose name matches `model`
    (a glob: `*`, `?`, `[...]`, case-sensitive, as fnmatch.fnmatchcase)."""

    provider: str
    model: str
    input: Decimal
    cache_read: Decimal
    cache_write: Decimal
    output: Decimal


# Wide enough that tokens (int64) x any price a file may hold (<= 1e6, 12 decimals) and their sum are exact.
_EXACT = Context(prec=80, rounding=ROUND_HALF_UP)
_ONE = Decimal(1)


def micros(price: Price, tokens: Tokens) -> int:
    """The reply's cost in micro-units, rounded once, half up."""
    exact = _EXACT.add(
        _EXACT.add(_EXACT.multiply(tokens.input, price.input), _EXACT.multiply(tokens.cache_read, price.cache_read)),
        _EXACT.add(_EXACT.multiply(tokens.cache_write, price.cache_write), _EXACT.multiply(tokens.output, price.output)),
    )
    return int(exact.quantize(_ONE, rounding=ROUND_HALF_UP, context=_EXACT))


@dataclass(frozen=True, slots=True)
class PriceTable:
    """One currency and its prices; the first entry of a provider whose glob matches a model wins."""

    currency: str
    prices: tuple[Price, ...] = ()
    _by_provider: dict[str, tuple[tuple[Callable[[str], object], Price], ...]] = field(
        init=False, repr=False, compare=False, hash=False
    )

    EMPTY: ClassVar[PriceTable]

    def __post_init__(self) -> None:
        # Compiled once per table (fnmatchcase's own cache holds 32768 patterns, a table may hold more).
        by_provider: dict[str, list[tuple[Callable[[str], object], Price]]] = {}
        for price in self.prices:
            matches = re.compile(fnmatch.translate(price.model)).match
            by_provider.setdefault(price.provider, []).append((matches, price))
        object.__setattr__(self, "_by_provider", {name: tuple(entries) for name, entries in by_provider.items()})

    def price(self, provider: str, model: str) -> Price | None:
        for matches, price in self._by_provider.get(provider, ()):
            if matches(model):
                return price
        return None

    def cost(self, provider: str, model: str, tokens: Tokens) -> Cost:
        price = self.price(provider, model)
        if price is None:
            return Cost(0, self.currency, priced=False)
        return Cost(micros(price, tokens), self.currency)


PriceTable.EMPTY = PriceTable("")
NO_PRICES = PriceTable.EMPTY
