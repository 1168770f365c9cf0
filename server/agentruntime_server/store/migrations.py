"""The SQLite schema as an ordered list of migrations; `PRAGMA user_version` is the version.

Append a new entry to change the schema; never edit one that has shipped."""

from __future__ import annotations

import sqlite3

MIGRATIONS: list[str] = [
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
            for statement in filter(str.strip, script.split(";")):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {number}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    return len(MIGRATIONS)
