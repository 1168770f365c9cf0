"""The SQLite schema as an ordered list of migrations; `PRAGMA user_version` is the version.

Append a new entry to change the schema; never edit one that has shipped. An entry is SQL,
or a function for a migration that must read and rewrite rows."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable

from pydantic import TypeAdapter

from ...domain.journal import Tree
from ...domain.journal.replay import replay
from ...domain.vocabulary import AgentSpec
from .. import payloads
from . import legacy

log = logging.getLogger(__name__)


def _to_journal(db: sqlite3.Connection) -> None:
    """3: the journal. Every runtime's rows become journal steps (store/sqlite/legacy.py); the
    tables they came from are dropped."""
    db.execute(
        "CREATE TABLE journal (runtime_id TEXT NOT NULL, seq INTEGER NOT NULL, at REAL NOT NULL, "
        "first_event INTEGER NOT NULL, last_event INTEGER NOT NULL, step BLOB NOT NULL, "
        "PRIMARY KEY (runtime_id, seq)) WITHOUT ROWID"
    )
    db.execute("CREATE INDEX journal_by_event ON journal (runtime_id, last_event)")
    db.execute("ALTER TABLE runtimes ADD COLUMN running INTEGER NOT NULL DEFAULT 0")
    now = time.time()
    for (runtime_id,) in db.execute("SELECT id FROM runtimes ORDER BY id").fetchall():
        entries = legacy.runtime_entries(db, runtime_id, now)
        db.executemany(
            "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step) VALUES (?, ?, ?, ?, ?, ?)",
            [(runtime_id, e.seq, e.at, e.first_event, e.last_event, payloads.encode(e.step)) for e in entries],
        )
    db.execute("UPDATE runtimes SET running = 1 WHERE id IN (SELECT DISTINCT runtime_id FROM handles WHERE state = 2)")
    for table in ("handles", "messages", "tool_results", "started_calls", "answers", "events"):
        db.execute(f"DROP TABLE {table}")


def _counted(db: sqlite3.Connection) -> None:
    """5: what ListRuntimes and retention read of the runtimes migration 4 brought over: it
    left their handle counts at 0 (each journal is replayed for them) and their last write at
    their creation (the time of their newest step instead)."""
    agents = TypeAdapter(tuple[AgentSpec, ...])
    for runtime_id, defined in db.execute("SELECT id, agents FROM runtimes WHERE handles = 0").fetchall():
        tree = Tree(runtime_id, agents.validate_json(defined))
        for (step,) in db.execute("SELECT step FROM journal WHERE runtime_id = ? ORDER BY seq", (runtime_id,)).fetchall():
            payloads.decode(step).apply(tree)
        db.execute(
            "UPDATE runtimes SET handles = ?, running_handles = ?, suspended_handles = ?, "
            "updated_at = max(updated_at, coalesce((SELECT max(at) FROM journal WHERE runtime_id = ?), 0)) WHERE id = ?",
            (*tree.counts[:3], runtime_id, runtime_id),
        )


def _spent(db: sqlite3.Connection) -> None:
    """10: what each runtime's handles spent, tokens and cost, for ListRuntimes: read from
    the journals of the runtimes there are (a runtime writes its figures whole from then on)."""
    for column in ("tokens INTEGER NOT NULL DEFAULT 0", "cost_micros INTEGER NOT NULL DEFAULT 0"):
        db.execute(f"ALTER TABLE runtimes ADD COLUMN {column}")
    db.execute("ALTER TABLE runtimes ADD COLUMN cost_currency TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE runtimes ADD COLUMN cost_priced INTEGER NOT NULL DEFAULT 1")
    agents = TypeAdapter(tuple[AgentSpec, ...])
    for runtime_id, defined in db.execute("SELECT id, agents FROM runtimes").fetchall():
        tree = Tree(runtime_id, agents.validate_json(defined))
        rows = db.execute(
            "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = ? ORDER BY seq", (runtime_id,)
        ).fetchall()
        try:
            replay(tree, [entry for values in rows for entry in payloads.ungrouped(*values)])
        except Exception as exc:  # a figure to show is not worth refusing the store for: its next write fills it in
            log.warning("runtime %s: its spend could not be read from its journal (%s)", runtime_id, type(exc).__name__)
            continue
        figures = tree.counts
        db.execute(
            "UPDATE runtimes SET tokens = ?, cost_micros = ?, cost_currency = ?, cost_priced = ? WHERE id = ?",
            (figures.tokens, figures.cost_micros, figures.cost_currency, figures.cost_priced, runtime_id),
        )


def _short_groups(db: sqlite3.Connection) -> None:
    """12: a journal row holds at most payloads.GROUP_STEPS steps and GROUP_BYTES of them (a
    page of Watch's history decodes a row's whole array): the longer rows schema 6 wrote
    (one tick of a wide fan-out: thousands of steps, megabytes) are cut. Each runtime's bytes
    change by the framing of the new rows."""
    long = db.execute(
        "SELECT runtime_id, seq FROM journal WHERE last_seq - seq >= ? OR (last_seq > seq AND length(step) > ?)",
        (payloads.GROUP_STEPS, payloads.GROUP_BYTES),
    ).fetchall()
    for runtime_id, seq in long:  # one row in memory at a time
        (stored,) = db.execute("SELECT step FROM journal WHERE runtime_id = ? AND seq = ?", (runtime_id, seq)).fetchone()
        steps = [(runtime_id, s, at, first, last, bytes(step)) for s, at, first, last, step in payloads.GROUP.decode(stored)]
        groups = payloads.grouped(steps)
        db.execute("DELETE FROM journal WHERE runtime_id = ? AND seq = ?", (runtime_id, seq))
        db.executemany(
            "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step, last_seq) VALUES (?, ?, ?, ?, ?, ?, ?)",
            groups,
        )
        grown = sum(len(group[5]) for group in groups) - len(stored)
        db.execute("UPDATE runtimes SET bytes = bytes + ? WHERE id = ?", (grown, runtime_id))


MIGRATIONS: list[str | Callable[[sqlite3.Connection], None]] = [
    # 1: runtimes, handles, transcripts, the tool journal, in-flight calls, answers.
    """
    CREATE TABLE runtimes (
        id TEXT PRIMARY KEY,
        agents TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE handles (
        runtime_id TEXT NOT NULL,
        handle_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        parent_id TEXT NOT NULL,
        agent TEXT NOT NULL,
        child_key TEXT NOT NULL,
        state INTEGER NOT NULL,
        turns INTEGER NOT NULL,
        own_tokens INTEGER NOT NULL,
        total_tokens INTEGER NOT NULL,
        tool_calls INTEGER NOT NULL,
        subtree_tool_calls INTEGER NOT NULL,
        budget TEXT NOT NULL,
        inbox TEXT,
        last_result TEXT,
        pending TEXT,
        approved TEXT,
        in_doubt TEXT,
        PRIMARY KEY (runtime_id, handle_id)
    ) WITHOUT ROWID;
    CREATE INDEX handles_by_state ON handles (state);
    CREATE TABLE messages (
        runtime_id TEXT NOT NULL,
        handle_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        tool_calls TEXT,
        tool_call_id TEXT NOT NULL,
        is_error INTEGER NOT NULL,
        turn INTEGER NOT NULL,
        PRIMARY KEY (runtime_id, handle_id, idx)
    ) WITHOUT ROWID;
    CREATE TABLE tool_results (
        runtime_id TEXT NOT NULL,
        handle_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        output TEXT NOT NULL,
        is_error INTEGER NOT NULL,
        PRIMARY KEY (runtime_id, handle_id, call_id)
    ) WITHOUT ROWID;
    CREATE TABLE started_calls (
        runtime_id TEXT NOT NULL,
        handle_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        PRIMARY KEY (runtime_id, handle_id, call_id)
    ) WITHOUT ROWID;
    CREATE TABLE answers (
        runtime_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        answer TEXT NOT NULL,
        leaf_id TEXT NOT NULL,
        PRIMARY KEY (runtime_id, request_id)
    ) WITHOUT ROWID;
    """,
    # 2: the event log behind Watch.
    """
    CREATE TABLE events (
        runtime_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        event TEXT NOT NULL,
        PRIMARY KEY (runtime_id, seq)
    ) WITHOUT ROWID;
    """,
    _to_journal,
    # 4: tenants, and what ListRuntimes and retention read without loading a journal.
    """
    ALTER TABLE runtimes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE runtimes ADD COLUMN handles INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runtimes ADD COLUMN running_handles INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runtimes ADD COLUMN suspended_handles INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runtimes ADD COLUMN updated_at REAL NOT NULL DEFAULT 0;
    UPDATE runtimes SET updated_at = created_at;
    CREATE INDEX runtimes_by_tenant ON runtimes (tenant, created_at, id);
    CREATE INDEX runtimes_by_update ON runtimes (updated_at);
    CREATE TABLE tenant_tokens (
        tenant TEXT NOT NULL,
        minute INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        PRIMARY KEY (tenant, minute)
    ) WITHOUT ROWID
    """,
    _counted,
    # 6: a journal row holds the steps one group commit wrote for its runtime (a JSON array),
    # from `seq` to `last_seq`; a row from before holds one step (`last_seq` NULL). A server of
    # an older schema refuses the store (SchemaTooNew) rather than misread its rows.
    "ALTER TABLE journal ADD COLUMN last_seq INTEGER",
    # 7: the bytes each runtime takes (its definitions and its steps), for the tenants' store
    # quota, read through an index that covers it. Rows written before count whole (a group
    # row's few bytes of framing with its steps).
    """
    ALTER TABLE runtimes ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE runtimes SET bytes = length(CAST(agents AS BLOB))
        + coalesce((SELECT sum(length(step)) FROM journal WHERE journal.runtime_id = runtimes.id), 0);
    CREATE INDEX runtimes_bytes ON runtimes (tenant, bytes)
    """,
    # 8: the answers of CreateRuntime and DeleteRuntime calls made with request ids, per tenant
    # (scope: "" for CreateRuntime, the runtime's id for DeleteRuntime).
    """
    CREATE TABLE replies (
        tenant TEXT NOT NULL,
        scope TEXT NOT NULL,
        request_id TEXT NOT NULL,
        rpc TEXT NOT NULL,
        digest TEXT NOT NULL,
        runtime_id TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (tenant, scope, request_id)
    ) WITHOUT ROWID;
    CREATE INDEX replies_by_age ON replies (at);
    """,
    # 9: one row the store writes to learn whether it can write again, after a write failed
    # for want of space or I/O (store/sqlite/connection.py).
    "CREATE TABLE store_probe (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL)",
    # 10: what the tenants' model calls cost, by minute, beside their tokens (micro-units).
    "ALTER TABLE tenant_tokens ADD COLUMN micros INTEGER NOT NULL DEFAULT 0",
    _spent,
    _short_groups,
    # 13: where a fork or a replay came from (its source's id, the cut), for ListRuntimes.
    """
    ALTER TABLE runtimes ADD COLUMN forked_from TEXT NOT NULL DEFAULT '';
    ALTER TABLE runtimes ADD COLUMN fork_seq INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runtimes_forks ON runtimes (tenant, forked_from, created_at, id) WHERE forked_from != ''
    """,
]


class SchemaTooNew(RuntimeError):
    pass


def migrate(db: sqlite3.Connection) -> int:
    """Applies every migration the file has not seen, each in its own transaction."""
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise SchemaTooNew(
            f"the store is at schema version {version}, newer than this server knows ({len(MIGRATIONS)}); upgrade the server"
        )
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            if callable(script):
                script(db)
            else:
                for statement in filter(str.strip, script.split(";")):
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {number}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # (SQLite may have rolled it back itself: a full disk)
                db.execute("ROLLBACK")
            raise
    return len(MIGRATIONS)
