"""AGENTRUNTIME_PRICES: the price table's JSON file, checked as hostile input, and watched.

A bad file at start stops the server (StartupError, one line naming the file and the line);
a bad change while serving keeps the last good table and logs one warning saying why.
Every problem names the line of the entry (or of the JSON error) it is on."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable
from decimal import Context, Decimal
from typing import Any

from .domain.billing.prices import Price, PriceTable
from .domain.billing.usage import Cost, Tokens
from .settings import PROVIDER_NAME, StartupError

log = logging.getLogger(__name__)

SETTING = "AGENTRUNTIME_PRICES"
MAX_FILE_BYTES = 1 << 20
MAX_ENTRIES = 10_000
MAX_MODEL_CHARS = 200
MAX_PRICE = Decimal(1_000_000)
MAX_DECIMALS = 12  # keeps every product exact (domain/billing/prices.py) and refuses a 1e-999999 exponent
KINDS = ("input", "cache_read", "cache_write", "output")
ENTRY_KEYS = ("provider", "model", *KINDS)
CURRENCY = re.compile(r"[A-Z]{3}")
RECHECK_SECONDS = 1.0
Signature = tuple[int, int, int, int]


class PricesError(ValueError):
    """The prices file cannot be used; the message names the file and, when it has one, the line."""


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON lets a key repeat and the last one win; a price file that says two things is refused."""
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return result


def _shown(text: str, limit: int = 40) -> str:
    """A string of the file in a message: quoted, escaped, cut."""
    return json.dumps(text if len(text) <= limit else text[:limit] + "...")


# Numbers stay exact (Decimal); NaN and Infinity parse, then fail the finite check with a line.
_DECODER = json.JSONDecoder(parse_float=Decimal, parse_int=Decimal, parse_constant=Decimal, object_pairs_hook=_no_duplicates)
_SPACE = re.compile(r"[ \t\n\r]*")


class _Reader:
    """Walks the document's two outer levels (the object, the prices array) itself, so each
    entry's offset is known; every value inside them is parsed by the json module."""

    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text

    def error(self, offset: int, problem: str) -> PricesError:
        line = self.text.count("\n", 0, offset) + 1
        return PricesError(f"{SETTING} {self.path} line {line}: {problem}")

    def skip(self, offset: int) -> int:
        found = _SPACE.match(self.text, offset)
        assert found is not None  # the pattern matches the empty string
        return found.end()

    def expect(self, offset: int, tokens: str, what: str) -> str:
        if offset < len(self.text) and self.text[offset] in tokens:
            return self.text[offset]
        raise self.error(offset, f"is not JSON (expected {what})")

    def value(self, offset: int) -> tuple[Any, int]:
        try:
            return _DECODER.raw_decode(self.text, offset)
        except json.JSONDecodeError as error:
            raise self.error(error.pos, f"is not JSON ({error.msg})") from None
        except RecursionError:
            raise self.error(offset, "is nested too deeply") from None
        except _Duplicate as duplicate:
            raise self.error(offset, f"repeats the key {_shown(duplicate.key)}") from None

    def document(self) -> dict[str, tuple[Any, int]]:
        """The top object: each key's value (the prices array as its elements and their
        offsets) and the offset of that value."""
        offset = self.skip(0)
        self.expect(offset, "{", '{"currency": ..., "prices": [...]}')
        members: dict[str, tuple[Any, int]] = {}
        offset = self.skip(offset + 1)
        if not self.text.startswith("}", offset):
            while True:
                self.expect(offset, '"', "a key in double quotes")
                key, after = self.value(offset)
                if key in members:
                    raise self.error(offset, f"repeats the key {_shown(key)}")
                if key not in ("currency", "prices"):
                    raise self.error(offset, f'unknown key {_shown(key)}; a prices file has "currency" and "prices"')
                offset = self.skip(after)
                self.expect(offset, ":", "':' after a key")
                start = self.skip(offset + 1)
                if key == "prices" and self.text.startswith("[", start):
                    value, end = self.elements(start)
                else:
                    value, end = self.value(start)
                members[key] = (value, start)
                offset = self.skip(end)
                if self.expect(offset, ",}", "',' or '}'") == "}":
                    break
                offset = self.skip(offset + 1)
        offset = self.skip(offset + 1)
        if offset != len(self.text):
            raise self.error(offset, "is not JSON (extra data after the object)")
        return members

    def elements(self, offset: int) -> tuple[list[tuple[Any, int]], int]:
        """The array at `offset`: each element with its offset (at most MAX_ENTRIES); the offset past it."""
        elements: list[tuple[Any, int]] = []
        offset = self.skip(offset + 1)
        if self.text.startswith("]", offset):
            return elements, offset + 1
        while True:
            if len(elements) == MAX_ENTRIES:
                raise self.error(offset, f'"prices" holds more than {MAX_ENTRIES} entries')
            value, end = self.value(offset)
            elements.append((value, offset))
            offset = self.skip(end)
            if self.expect(offset, ",]", "',' or ']'") == "]":
                return elements, offset + 1
            offset = self.skip(offset + 1)


def parse_prices(path: str, data: bytes) -> PriceTable:
    """The file's content as a price table; PricesError names the line of what is wrong."""
    if len(data) > MAX_FILE_BYTES:
        raise PricesError(f"{SETTING} {path}: is larger than {MAX_FILE_BYTES} bytes (1 MiB)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise PricesError(f"{SETTING} {path} line {line}: is not UTF-8 text") from None
    reader = _Reader(path, text)
    members = reader.document()
    for key in ("currency", "prices"):
        if key not in members:
            raise reader.error(reader.skip(0), f'"{key}" is missing')
    currency, offset = members["currency"]
    if not isinstance(currency, str) or not CURRENCY.fullmatch(currency):
        raise reader.error(offset, '"currency" must be a 3-letter code in capitals (ISO 4217: "USD", "EUR")')
    entries, offset = members["prices"]
    if not text.startswith("[", offset):
        raise reader.error(offset, '"prices" must be a list of {"provider", "model", "input", ...} objects')
    return PriceTable(currency, tuple(_entry(reader, item, at) for item, at in entries))


def _entry(reader: _Reader, item: Any, offset: int) -> Price:
    def bad(problem: str) -> PricesError:
        return reader.error(offset, problem)

    if not isinstance(item, dict):
        raise bad('an entry must be an object {"provider", "model", "input", "cache_read", "cache_write", "output"}')
    unknown = [key for key in item if key not in ENTRY_KEYS]
    if unknown:
        raise bad(f"unknown key {_shown(unknown[0])}; an entry has {', '.join(ENTRY_KEYS)}")
    missing = [key for key in ENTRY_KEYS if key not in item]
    if missing:
        hint = " (every kind of token needs its price, 0 included)" if missing[0] in KINDS else ""
        raise bad(f'"{missing[0]}" is missing{hint}')
    provider, model = item["provider"], item["model"]
    if not isinstance(provider, str) or not PROVIDER_NAME.fullmatch(provider):
        raise bad('"provider" must be a provider name (a letter, then up to 63 letters, digits, "_", "-" or ".")')
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_CHARS or not model.isprintable():
        raise bad(f'"model" must be a model name or glob of 1 to {MAX_MODEL_CHARS} printable characters')
    amounts = [_amount(item[kind], kind, bad) for kind in KINDS]
    return Price(provider, model, *amounts)


def _amount(value: Any, kind: str, bad: Callable[[str], PricesError]) -> Decimal:
    if not isinstance(value, Decimal) or not value.is_finite() or not 0 <= value <= MAX_PRICE:
        raise bad(f'"{kind}" must be a number >= 0 and <= {MAX_PRICE} (per million tokens)')
    exponent = value.normalize(Context(prec=len(value.as_tuple().digits))).as_tuple().exponent  # exact: every digit kept
    if isinstance(exponent, int) and exponent < -MAX_DECIMALS:
        raise bad(f'"{kind}" has more than {MAX_DECIMALS} decimal places')
    return value.copy_abs()  # -0 is 0


def _signature(path: str) -> Signature:
    status = os.stat(path)
    return (status.st_mtime_ns, status.st_size, status.st_ino, status.st_dev)


def _read(path: str) -> tuple[Signature, bytes]:
    signature = _signature(path)
    with open(path, "rb") as file:
        return signature, file.read(MAX_FILE_BYTES + 1)


def _unreadable(path: str, error: OSError) -> str:
    return f"{SETTING} {path}: cannot read it ({error.strerror or type(error).__name__})"


def load_prices(path: str) -> PriceTable:
    """The table in the file at `path`; PricesError if it cannot be read or used."""
    try:
        _, data = _read(path)
    except OSError as error:
        raise PricesError(_unreadable(path, error)) from None
    return parse_prices(path, data)


class PriceWatch:
    """The price table in force: the file's last good version. `start()` looks at the file
    every `interval` seconds (a stat, in a thread) and reads it again when its mtime, size or
    inode changed. Write a new version atomically (write another file, rename it over)."""

    def __init__(self, path: str, table: PriceTable, signature: Signature | None, interval: float = RECHECK_SECONDS) -> None:
        self.path = path
        self.interval = interval
        self._table = table
        self._seen: object = signature  # the version last looked at, good or bad: each is read once
        self._task: asyncio.Task[None] | None = None

    @property
    def current(self) -> PriceTable:
        return self._table

    def cost(self, provider: str, model: str, tokens: Tokens) -> Cost:
        """At the prices in force now (ports.PriceSource)."""
        return self._table.cost(provider, model, tokens)

    def price(self, provider: str, model: str) -> Price | None:
        return self._table.price(provider, model)

    def start(self) -> None:
        if self.path and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="prices watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # the watch outlives any surprise: the table in force stays
                log.exception("%s %s: the price table could not be checked", SETTING, self.path)

    async def check(self) -> None:
        """One look at the file: a new good version replaces the table, a bad one is logged once."""
        looked = await asyncio.to_thread(self._look, self._seen)
        if looked is None:
            return
        version, outcome = looked
        self._seen = version
        if isinstance(outcome, PriceTable):
            self._table = outcome
            log.info("prices re-read from %s: %d entries", self.path, len(outcome.prices))
        else:
            log.warning("%s; keeping the prices read before (%d entries)", outcome, len(self._table.prices))

    def _look(self, seen: object) -> tuple[object, PriceTable | str] | None:
        """In a thread: None when the file is the version last looked at, else that version and
        its table or what is wrong with it."""
        try:
            signature = _signature(self.path)
            if signature == seen:
                return None
            signature, data = _read(self.path)
        except OSError as error:
            version = ("unreadable", error.errno)
            return None if version == seen else (version, _unreadable(self.path, error))
        try:
            return signature, parse_prices(self.path, data)
        except PricesError as error:
            return signature, str(error)


def open_prices(path: str, interval: float = RECHECK_SECONDS) -> PriceWatch:
    """The watch of AGENTRUNTIME_PRICES (not started); "" prices nothing. A file that cannot be
    used stops the start (StartupError: `agentruntime serve` prints it and exits 2)."""
    if not path:
        return PriceWatch("", PriceTable.EMPTY, None, interval)
    try:
        signature, data = _read(path)
        table = parse_prices(path, data)
    except OSError as error:
        raise StartupError(_unreadable(path, error)) from None
    except PricesError as error:
        raise StartupError(str(error)) from None
    return PriceWatch(path, table, signature, interval)
