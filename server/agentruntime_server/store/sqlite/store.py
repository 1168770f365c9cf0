"""`sqlite:///path`: the durable default. WAL mode, one writer (this process). A runtime is
a row of definitions plus its journal, appended in order: a row per group commit and
runtime, holding the steps it wrote then (`payloads.grouped`; rows written before schema 6
hold one step each).

Each message is in exactly one step, so storage grows with the transcript and not with
its square (a model call's prompt is the transcript so far, never a new copy of it).
Calls run on the event loop thread: a write is a short local statement and no await
happens inside one, so it is atomic with respect to the runtime's in-memory state.

A write that fails for want of space or I/O (sqlite3.OperationalError: a full disk, a file
another process keeps locked) is weather (docs/durability.md#store-unavailable): it is
rolled back whole, and the store takes no writes until a probe (a one-row write, every
PROBE_EVERY seconds) goes through. Meanwhile appends, flushes and writes raise
errors.StoreCannotWrite (UNAVAILABLE STORE_FULL to callers), reads go on, the health
callbacks say so, and the runtimes whose rows the failed commit carried are reported
`on_unwritten` (their copies are ahead of the store: they stop, and are read again once it
writes). Any other failed commit (a constraint broken by its own write, a damaged file)
breaks the store for good: errors.StoreBroken until the server is restarted."""

from __future__ import annotations

from .journal import Journal
from .runtimes import Runtimes
from .tenants import Tenants


class SqliteStore(Journal, Runtimes, Tenants):
    """The store's layers put together: the connection and its health (connection.py), the
    group commit (commits.py), and on it the journals, the runtimes' rows and the tenants'
    replies and ledgers."""

    durable = True
