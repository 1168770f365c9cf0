"""`postgresql://user:password@host:port/db`: the store on PostgreSQL (asyncpg, one pool).

The same logical tables and the same semantics as SqliteStore (store/sqlite/): a runtime
is a row of definitions plus its journal, one row per step, appended in order; an append is
checked (its seqs) and encoded when it is made, all or nothing, and buffered; the rows every
runtime appended are written by one statement (statements.COMMIT: one round trip,
atomic) over one kept connection, when the tick ends or, while a commit is under way, as
soon as it ends (the next commit gathers everything appended meanwhile); `flush` awaits that commit.

The database going away is weather (docs/durability.md#store-unavailable): a commit that
fails, or any statement that loses its connection, makes the store unavailable until a probe
reaches the database again (every PROBE_EVERY seconds). Meanwhile every flush, append and
read raises errors.StoreUnavailable at once (UNAVAILABLE STORE_UNAVAILABLE to callers), and
the health callbacks say so (`on_health`). The runtimes whose rows a failed commit carried,
or whose append was refused, have copies in memory ahead of the store: their rows still
buffered are forgotten, and the `on_unwritten` callbacks are told, so that those copies stop
and are read again from the store once it is back. Nothing unacknowledged is kept as if it
had been written, and nothing acknowledged is lost.

asyncpg is asynchronous, so commits overlap the event loop: they run one after another. Reads first await every commit of what was
appended before them (a store reads its own writes). The pool connects, and the schema is
migrated, on first use: opening a store (app.open_store) is synchronous.

Every commit first locks the rows of the runtimes it writes, and writes only runtimes whose
row is there (one deleted meanwhile, by another process, takes no rows). Replicas
(store/postgres/leases.py): once a PostgresLeases is attached, it keeps only the writes of
runtimes this process owns at the epoch it appended them under. The rest are refused
(fenced), never written, and every later append or flush(runtime) of that runtime raises
errors.Fenced, which says whether the runtime was deleted or another replica holds it.

The URL's password is a secret: it is never logged, and `redacted(url)` is what may be."""

from __future__ import annotations

from .journal import Journal
from .runtimes import Runtimes
from .tenants import Tenants


class PostgresStore(Journal, Runtimes, Tenants):
    """The store's layers put together: the connections and the database's weather
    (connection.py), what this process owns (ownership.py), the group commit (commits.py),
    and on it the journals, the runtimes' rows and the tenants' replies and ledgers."""

    durable = True
