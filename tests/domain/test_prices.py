"""The price table in the domain alone: which entry prices a reply, what it costs in micro-units
(rounded once per reply, half up), and how costs add up."""

from __future__ import annotations

from decimal import Decimal

from agentruntime_server.domain.billing.prices import NO_PRICES, UNPRICED, Cost, Price, PriceTable, Tokens, micros
from hypothesis import given
from hypothesis import strategies as st


def price(provider: str, model: str, input: str, cache_read: str = "0", cache_write: str = "0", output: str = "0") -> Price:
    return Price(provider, model, Decimal(input), Decimal(cache_read), Decimal(cache_write), Decimal(output))


TABLE = PriceTable(
    "USD",
    (
        price("openai", "gpt-4.1-mini*", "0.4", "0.1", "0", "1.6"),
        price("openai", "gpt-4.1*", "2", "0.5", "0", "8"),
        price("openai", "o?", "15", "7.5", "0", "60"),
        price("anthropic", "claude-[!o]*", "3", "0.3", "3.75", "15"),
        price("openrouter", "meta-llama/*:free", "0", "0", "0", "0"),
    ),
)


def test_tokens_total_is_every_kind_but_reasoning_which_output_holds() -> None:
    tokens = Tokens(input=100, cache_read=20, cache_write=3, output=50, reasoning=40)
    assert tokens.total == 173
    assert tokens.plus(Tokens(1, 2, 3, 4, 5)) == Tokens(101, 22, 6, 54, 45)
    assert Tokens().plus(Tokens()) == Tokens() and Tokens().total == 0


def test_the_first_entry_whose_glob_matches_the_model_wins() -> None:
    mini, full = TABLE.prices[0], TABLE.prices[1]
    assert TABLE.price("openai", "gpt-4.1-mini-2025-04-14") is mini  # both globs match: the first wins
    assert TABLE.price("openai", "gpt-4.1") is full
    assert TABLE.price("openai", "gpt-4.1-nano") is full
    assert TABLE.price("openai", "o3") is TABLE.prices[2]  # ? is one character
    assert TABLE.price("openai", "o3-mini") is None
    assert TABLE.price("anthropic", "claude-sonnet-4-5") is TABLE.prices[3]
    assert TABLE.price("anthropic", "claude-opus-4") is None  # [!o]: any character but o
    assert TABLE.price("openrouter", "meta-llama/llama-3.1-8b-instruct:free") is TABLE.prices[4]  # / is not special
    # The provider must be the entry's, exactly; globs are case-sensitive.
    assert TABLE.price("azure", "gpt-4.1") is None
    assert TABLE.price("OpenAI", "gpt-4.1") is None
    assert TABLE.price("openai", "GPT-4.1") is None


def test_a_reply_costs_tokens_times_price_per_million_in_micro_units() -> None:
    # gpt-4.1: 1000 input x 2 + 200 cache reads x 0.5 + 300 output x 8 = 2000 + 100 + 2400 micro-dollars.
    assert TABLE.cost("openai", "gpt-4.1", Tokens(input=1000, cache_read=200, output=300)) == Cost(4500, "USD", True)
    # claude: cache writes have their own price (3.75), above input's.
    assert TABLE.cost("anthropic", "claude-sonnet-4-5", Tokens(input=10, cache_write=1000, cache_read=5000, output=100)) == Cost(
        30 + 3750 + 1500 + 1500, "USD"
    )
    # A million output tokens at $8 per million: $8.
    assert TABLE.cost("openai", "gpt-4.1", Tokens(output=1_000_000)).micros == 8_000_000
    # A free model is priced, at 0.
    assert TABLE.cost("openrouter", "meta-llama/x:free", Tokens(input=10**9, output=10**9)) == Cost(0, "USD", True)


def test_reasoning_is_billed_once_as_the_output_it_is_part_of() -> None:
    thinking = TABLE.cost("openai", "o3", Tokens(input=100, output=1000, reasoning=900))
    plain = TABLE.cost("openai", "o3", Tokens(input=100, output=1000))
    assert thinking == plain == Cost(100 * 15 + 1000 * 60, "USD")


def test_a_reply_is_rounded_once_half_up() -> None:
    half = PriceTable("EUR", (price("p", "m", "0.5", "0.5", "0.5", "0.5"),))
    assert half.cost("p", "m", Tokens(input=1)).micros == 1  # 0.5 -> 1
    assert half.cost("p", "m", Tokens(input=3)).micros == 2  # 1.5 -> 2
    assert half.cost("p", "m", Tokens(input=2)).micros == 1
    # Once per reply, over all kinds: 0.5 + 0.5 + 0.5 = 1.5 -> 2, where rounding each kind would give 3.
    assert half.cost("p", "m", Tokens(input=1, cache_read=1, cache_write=1)).micros == 2
    tiny = PriceTable("USD", (price("p", "m", "0.000000000001", output="0.499999999999"),))
    assert tiny.cost("p", "m", Tokens(input=1, output=1)).micros == 1  # 0.000000000001 + 0.499999999999: 0.5 exactly, up
    assert tiny.cost("p", "m", Tokens(output=1)).micros == 0


def test_a_model_without_a_price_costs_nothing_and_says_so() -> None:
    assert TABLE.cost("openai", "gpt-5", Tokens(input=10)) == Cost(0, "USD", priced=False)
    assert NO_PRICES.cost("openai", "gpt-4.1", Tokens(input=10)) == Cost(0, "", priced=False) == UNPRICED
    assert PriceTable.EMPTY is NO_PRICES


def test_costs_add_up_and_an_unpriced_call_marks_the_sum() -> None:
    usd = Cost(1500, "USD")
    assert Cost().plus(usd) == usd.plus(Cost()) == usd  # Cost() is the zero: nothing spent, nothing unpriced
    assert usd.plus(Cost(2, "USD")) == Cost(1502, "USD", True)
    assert usd.plus(Cost(0, "USD", priced=False)) == Cost(1500, "USD", False)
    assert UNPRICED.plus(usd) == Cost(1500, "USD", False)
    # Two currencies are not one amount: the first stays, and the sum is not a complete price.
    assert usd.plus(Cost(7, "EUR")) == Cost(1507, "USD", False)
    assert Cost(7, "EUR").plus(usd) == Cost(1507, "EUR", False)


@given(
    tokens=st.builds(Tokens, *[st.integers(0, 2**63 - 1)] * 4),
    prices=st.lists(st.decimals(0, 1_000_000, places=12), min_size=4, max_size=4),
)
def test_micros_are_the_exact_sum_rounded_half_up(tokens: Tokens, prices: list[Decimal]) -> None:
    """Tokens as large as int64 and prices with 12 decimals: no digit is lost before the one rounding."""
    entry = Price("p", "m", *prices)
    # The same sum in integers of 1e-12 micro-units, rounded half up by hand.
    numerator = sum(
        count * int(amount * 10**12)
        for count, amount in zip((tokens.input, tokens.cache_read, tokens.cache_write, tokens.output), prices, strict=True)
    )
    assert micros(entry, tokens) == (numerator + 5 * 10**11) // 10**12
