"""The PostgreSQL schema as an ordered list of migrations; the `schema_version` table holds
the version (one row).

Append a new entry to change the schema; never edit one that has shipped. The logical
tables are SQLite's (store/sqlite/migrations.py), at that schema's last version: a PostgreSQL
store starts there, with no history to migrate."""

from __future__ import annotations

from typing import Any

MIGRATIONS: list[str] = [
    # 1: runtimes, the journal, tenants' tokens.
    """
    CREATE TABLE runtimes (
        id TEXT PRIMARY KEY,
        agents JSON NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        tenant TEXT NOT NULL DEFAULT 'default',
        running BOOLEAN NOT NULL DEFAULT FALSE,
        handles INTEGER NOT NULL DEFAULT 0,
        running_handles INTEGER NOT NULL DEFAULT 0,
        suspended_handles INTEGER NOT NULL DEFAULT 0,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX runtimes_by_tenant ON runtimes (tenant, created_at, id);
    CREATE INDEX runtimes_by_update ON runtimes (updated_at);
    CREATE INDEX runtimes_running ON runtimes (id) WHERE running;
    CREATE TABLE journal (
        runtime_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        first_event BIGINT NOT NULL,
        last_event BIGINT NOT NULL,
        step BYTEA NOT NULL,
        PRIMARY KEY (runtime_id, seq)
    );
    CREATE INDEX journal_by_event ON journal (runtime_id, last_event);
    CREATE TABLE tenant_tokens (
        tenant TEXT NOT NULL,
        minute BIGINT NOT NULL,
        tokens BIGINT NOT NULL,
        PRIMARY KEY (tenant, minute)
    );
    """,
    # 2: replicas and leases. A runtime's owner is the replica executing it (NULL: none);
    # its epoch grows with every claim, and a journal write is accepted only from the owner
    # at the epoch it claimed (store/postgres/leases.py).
    """
    CREATE TABLE replicas (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    );
    ALTER TABLE runtimes ADD COLUMN owner TEXT, ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
    CREATE INDEX runtimes_by_owner ON runtimes (owner) WHERE owner IS NOT NULL;
    """,
    # 3: the bytes each runtime takes (its definitions and its steps), for the tenants' store
    # quota (summed over runtimes_by_tenant's rows).
    """
    ALTER TABLE runtimes ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
    UPDATE runtimes r SET bytes = octet_length(r.agents::text)
        + COALESCE((SELECT SUM(octet_length(j.step)) FROM journal j WHERE j.runtime_id = r.id), 0);
    """,
    # 4: the answers of CreateRuntime and DeleteRuntime calls made with request ids, per tenant
    # (scope: "" for CreateRuntime, the runtime's id for DeleteRuntime).
    """
    CREATE TABLE replies (
        tenant TEXT NOT NULL,
        scope TEXT NOT NULL,
        request_id TEXT NOT NULL,
        rpc TEXT NOT NULL,
        digest TEXT NOT NULL,
        runtime_id TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, scope, request_id)
    );
    CREATE INDEX replies_by_age ON replies (at);
    """,
    # 5: what the tenants' model calls cost, by minute, beside their tokens (micro-units).
    "ALTER TABLE tenant_tokens ADD COLUMN micros BIGINT NOT NULL DEFAULT 0",
    # 6: what each runtime's handles spent, for ListRuntimes. A runtime written before shows
    # nothing spent until its next write, which stores its figures whole.
    """
    ALTER TABLE runtimes ADD COLUMN tokens BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE runtimes ADD COLUMN cost_micros BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE runtimes ADD COLUMN cost_currency TEXT NOT NULL DEFAULT '';
    ALTER TABLE runtimes ADD COLUMN cost_priced BOOLEAN NOT NULL DEFAULT TRUE
    """,
    # 7: where a fork or a replay came from (its source's id, the cut), for ListRuntimes.
    """
    ALTER TABLE runtimes ADD COLUMN forked_from TEXT NOT NULL DEFAULT '';
    ALTER TABLE runtimes ADD COLUMN fork_seq BIGINT NOT NULL DEFAULT 0;
    CREATE INDEX runtimes_forks ON runtimes (tenant, forked_from, created_at) WHERE forked_from <> ''
    """,
]

# pg_advisory_xact_lock's key: stores opening one database at once migrate it one at a time.
_LOCK = 0x61676E7472756E  # "agntrun"


class SchemaTooNew(RuntimeError):
    pass


async def migrate(connection: Any, schema: str | None = None) -> int:
    """Applies every migration the database has not seen, in one transaction, under an
    advisory lock (replicas may start together). `schema`: created first if missing (the
    connection's search_path names it)."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
        if schema is not None:
            await connection.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}")
        await connection.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        version = await connection.fetchval("SELECT version FROM schema_version")
        if version is None:
            await connection.execute("INSERT INTO schema_version (version) VALUES (0)")
            version = 0
        if version > len(MIGRATIONS):
            raise SchemaTooNew(
                f"the store is at schema version {version}, newer than this server knows ({len(MIGRATIONS)}); upgrade the server"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await connection.execute(script)
            await connection.execute("UPDATE schema_version SET version = $1", number)
    return len(MIGRATIONS)


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
