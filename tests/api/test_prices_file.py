"""AGENTRUNTIME_PRICES on real files: what a bad file is told (the line of the entry or of the
JSON error), a start refused on it, and the watch that re-reads the file while serving: a good
change applies, a bad one or a vanished file keeps the last good table and warns once."""

from __future__ import annotations

import json
import logging
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from agentruntime_server.domain.billing.prices import Cost, PriceTable, Tokens
from agentruntime_server.prices_file import MAX_ENTRIES, PricesError, load_prices, open_prices, parse_prices
from agentruntime_server.settings import Settings, StartupError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.poll import until

ROOT = Path(__file__).resolve().parents[2]
LOGGER = "agentruntime_server.prices_file"
ENTRY = {"provider": "openai", "model": "gpt-4.1*", "input": 2.0, "cache_read": 0.5, "cache_write": 0.0, "output": 8.0}


def write(path: Path, text: str) -> None:
    """As an operator should: a whole new file renamed over the old one."""
    spare = path.with_suffix(".new")
    spare.write_text(text)
    os.replace(spare, path)


def document(*entries: object, currency: str = "USD") -> str:
    """A prices file of these entries (an entry that is not an object, too: the file is checked)."""
    return json.dumps({"currency": currency, "prices": list(entries)}, indent=2)


def entry(**changes: Any) -> dict[str, Any]:
    return {**ENTRY, **changes}


def refusal(path: Path, text: str) -> str:
    write(path, text)
    with pytest.raises(PricesError) as caught:
        load_prices(str(path))
    return str(caught.value)


def test_the_example_table_loads_and_prices_a_reply() -> None:
    table = load_prices(str(ROOT / "examples" / "prices.json"))
    assert table.currency == "USD"
    # gpt-4.1-mini is listed before gpt-4.1*: 1000 x 0.4 + 500 x 0.1 + 200 x 1.6 micro-dollars.
    assert table.cost("openai", "gpt-4.1-mini-2025-04-14", Tokens(input=1000, cache_read=500, output=200)) == Cost(770, "USD")
    assert table.cost("anthropic", "claude-sonnet-4-5", Tokens(input=1, cache_write=1000)) == Cost(3753, "USD")
    assert table.cost("anthropic", "claude-2", Tokens(input=1)) == Cost(0, "USD", priced=False)


def test_numbers_are_read_exactly(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    write(
        path,
        '{"currency": "EUR", "prices": [{"provider": "p", "model": "m", "input": 0.1, "cache_read": 3,'
        ' "cache_write": 1e2, "output": 0.000000000001}]}',
    )
    [price] = load_prices(str(path)).prices
    assert (price.input, price.cache_read, price.cache_write, price.output) == (
        Decimal("0.1"),
        Decimal(3),
        Decimal(100),
        Decimal("1E-12"),
    )


def test_an_entry_over_several_lines_is_named_by_the_line_it_starts_on(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    text = document(entry(), entry(model="gpt-4o*"), entry(model="o3", output=-1))
    # indent=2 puts each key on a line of its own: the third entry's "{" is on line 20, its "output" on line 26.
    assert text.splitlines()[19].strip() == "{" and '"o3"' in text.splitlines()[21]
    assert refusal(path, text) == (
        f'AGENTRUNTIME_PRICES {path} line 20: "output" must be a number >= 0 and <= 1000000 (per million tokens)'
    )


TWO_LINES = '{"currency": "USD",\n "prices": [\n'
BAD_FILES: list[tuple[str, str, str]] = [
    # (file text, the line named, what the message says)
    (TWO_LINES + '  {"provider": "openai" "model": "x"}]}', "line 3", "is not JSON (Expecting ',' delimiter)"),
    (TWO_LINES + json.dumps(ENTRY) + "\n" + json.dumps(ENTRY) + "]}", "line 4", "expected ',' or ']'"),
    ('{"currency": "USD", "prices": []}\n\n{}', "line 3", "extra data after the object"),
    ("", "line 1", "is not JSON (expected {"),
    ("\n\n[]", "line 3", "is not JSON (expected {"),
    ('{"currency": "usd",\n "prices": []}', "line 1", '"currency" must be a 3-letter code in capitals'),
    ('{"currency": "US$", "prices": []}', "line 1", '"currency" must be a 3-letter code'),
    ('{"prices": []}', "line 1", '"currency" is missing'),
    ('{"currency": "USD"}', "line 1", '"prices" is missing'),
    ('{"currency": "USD",\n "prices": {}}', "line 2", '"prices" must be a list'),
    ('{"currency": "USD",\n "currency": "EUR", "prices": []}', "line 2", 'repeats the key "currency"'),
    ('{"currency": "USD",\n "discount": 1, "prices": []}', "line 2", 'unknown key "discount"'),
    (document(entry(), 7), "line 12", "an entry must be an object"),
    (document({k: v for k, v in ENTRY.items() if k != "cache_write"}), "line 4", '"cache_write" is missing'),
    (document(entry(tier="batch")), "line 4", 'unknown key "tier"'),
    (TWO_LINES + '{"provider": "p", "model": "m", "input": 1, "input": 2}]}', "line 3", 'repeats the key "input"'),
    (document(entry(provider="open ai")), "line 4", '"provider" must be a provider name'),
    (document(entry(provider="")), "line 4", '"provider" must be a provider name'),
    (document(entry(model="")), "line 4", '"model" must be a model name or glob of 1 to 200 printable characters'),
    (document(entry(model="x" * 201)), "line 4", '"model" must be a model name or glob'),
    (document(entry(model="gpt\n4")), "line 4", '"model" must be a model name or glob'),
    (document(entry(model=7)), "line 4", '"model" must be'),
    (document(entry(input=-0.5)), "line 4", '"input" must be a number >= 0'),
    (document(entry(cache_read="0.5")), "line 4", '"cache_read" must be a number >= 0'),
    (document(entry(cache_write=True)), "line 4", '"cache_write" must be a number >= 0'),
    (document(entry(output=None)), "line 4", '"output" must be a number >= 0'),
    (document(entry(output=1_000_001)), "line 4", '"output" must be a number >= 0 and <= 1000000'),
    (document(entry()).replace("8.0", "NaN"), "line 4", '"output" must be a number'),
    (document(entry()).replace("8.0", "Infinity"), "line 4", '"output" must be a number'),
    (document(entry()).replace("8.0", "0.0000000000001"), "line 4", '"output" has more than 12 decimal places'),
    ('{"currency": "USD", "prices": [\n' + "[" * 100_000 + "]" * 100_000 + "]}", "line 2", "is nested too deeply"),
]


@pytest.mark.parametrize(("text", "line", "problem"), BAD_FILES)
def test_a_bad_file_is_refused_naming_the_line(tmp_path: Path, text: str, line: str, problem: str) -> None:
    path = tmp_path / "prices.json"
    message = refusal(path, text)
    assert message.startswith(f"AGENTRUNTIME_PRICES {path} {line}: ") and problem in message, message


def test_a_file_too_big_too_long_or_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    padded = document(entry()) + " " * (1 << 20)
    assert refusal(path, padded) == f"AGENTRUNTIME_PRICES {path}: is larger than 1048576 bytes (1 MiB)"
    small = json.dumps({"provider": "p", "model": "m", "input": 1, "cache_read": 1, "cache_write": 1, "output": 1})
    many = '{"currency": "USD", "prices": [\n' + ",\n".join([small] * (MAX_ENTRIES + 1)) + "]}"
    assert refusal(path, many) == f'AGENTRUNTIME_PRICES {path} line {MAX_ENTRIES + 2}: "prices" holds more than 10000 entries'
    exactly = '{"currency": "USD", "prices": [\n' + ",\n".join([small] * MAX_ENTRIES) + "]}"
    write(path, exactly)
    assert len(load_prices(str(path)).prices) == MAX_ENTRIES
    path.write_bytes(b'{"currency": "USD",\n"prices": [\n{"model": "caf\xe9"}]}')
    with pytest.raises(PricesError, match=r"line 3: is not UTF-8 text$"):
        load_prices(str(path))
    with pytest.raises(PricesError, match=r"prices.missing: cannot read it \(No such file or directory\)$"):
        load_prices(str(tmp_path / "prices.missing"))


def test_a_bad_file_stops_the_start_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    write(path, document(entry(), entry(input=-1)))
    with pytest.raises(StartupError) as caught:
        open_prices(str(path))
    assert str(caught.value) == (
        f'AGENTRUNTIME_PRICES {path} line 12: "input" must be a number >= 0 and <= 1000000 (per million tokens)'
    )
    with pytest.raises(StartupError, match="cannot read it"):
        open_prices(str(tmp_path / "nowhere.json"))


async def test_no_file_prices_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRUNTIME_PRICES", raising=False)
    watch = open_prices(Settings().prices)
    assert watch.current is PriceTable.EMPTY
    watch.start()  # nothing to watch: no task
    await watch.stop()
    monkeypatch.setenv("AGENTRUNTIME_PRICES", "/etc/agentruntime/prices.json")
    assert Settings().prices == "/etc/agentruntime/prices.json"


async def test_a_changed_file_is_picked_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "prices.json"
    write(path, document(entry()))
    watch = open_prices(str(path), interval=0.01)
    first = watch.current
    assert first.cost("openai", "gpt-4.1", Tokens(output=1)) == Cost(8, "USD")
    caplog.set_level(logging.INFO, logger=LOGGER)
    watch.start()
    try:
        write(path, document(entry(output=12), entry(provider="anthropic", model="claude-*")))
        await until(lambda: watch.current is not first, "the new prices")
    finally:
        await watch.stop()
    assert watch.current.cost("openai", "gpt-4.1", Tokens(output=1)) == Cost(12, "USD")
    assert f"prices re-read from {path}: 2 entries" in [record.getMessage() for record in caplog.records]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


async def test_a_bad_change_keeps_the_last_good_table_and_says_why_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "prices.json"
    write(path, document(entry()))
    watch = open_prices(str(path))
    good = watch.current
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(path, document(entry(), entry(output=-8)))
    for _ in range(3):
        await watch.check()
    assert watch.current is good
    assert warnings(caplog) == [
        f'AGENTRUNTIME_PRICES {path} line 12: "output" must be a number >= 0 and <= 1000000 (per million tokens);'
        " keeping the prices read before (1 entries)"
    ]
    write(path, document(entry(), entry(model="gpt-4o*")))  # fixed
    await watch.check()
    assert len(watch.current.prices) == 2
    write(path, '{"currency": "USD", "prices": [')  # another bad change: another warning
    await watch.check()
    await watch.check()
    assert len(watch.current.prices) == 2
    assert len(warnings(caplog)) == 2 and "line 1: is not JSON" in warnings(caplog)[1]


async def test_a_vanished_file_keeps_the_table(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "prices.json"
    write(path, document(entry()))
    watch = open_prices(str(path))
    good = watch.current
    caplog.set_level(logging.INFO, logger=LOGGER)
    path.unlink()
    for _ in range(3):
        await watch.check()
    assert watch.current is good
    assert warnings(caplog) == [
        f"AGENTRUNTIME_PRICES {path}: cannot read it (No such file or directory); keeping the prices read before (1 entries)"
    ]
    write(path, document(entry(input=3)))
    await watch.check()
    assert watch.current.prices[0].input == Decimal(3)


# ---- any document: a table or PricesError, nothing else ----

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.sampled_from(["USD", "openai", "gpt-*"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Mostly good documents with a few values changed, so that every check is reached.
near_entries = st.dictionaries(
    st.sampled_from([*ENTRY, "other"]), json_values | st.floats(-1.0, 2e6) | st.integers(-1, 2_000_000), max_size=2
).map(lambda changed: {**ENTRY, **changed})
near_documents = st.fixed_dictionaries(
    {"currency": st.sampled_from(["USD", "EUR", "JPY", "usd", 840]), "prices": st.lists(near_entries | json_values, max_size=4)}
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(value=json_values | near_documents, indent=st.sampled_from([None, 1]))
def test_any_json_document_is_a_table_or_a_prices_error(value: Any, indent: int | None) -> None:
    data = json.dumps(value, indent=indent).encode()
    try:
        assert isinstance(parse_prices("p.json", data), PriceTable)
    except PricesError as error:
        assert str(error).startswith("AGENTRUNTIME_PRICES p.json line "), error


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64) | st.text(alphabet='{}[]":,0123456789.eE-+ \n\\ucurenyUSDpis', max_size=80).map(str.encode))
def test_any_bytes_are_a_table_or_a_prices_error(data: bytes) -> None:
    try:
        parse_prices("p.json", data)
    except PricesError:
        pass
