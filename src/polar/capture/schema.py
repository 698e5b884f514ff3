"""The capture store's tables, and the migration that brings a store from an earlier version up
to them (a column added since is appended; old rows hold NULL there and read as before)."""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    metadata BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS completions (
    completion_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    finish_reason TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    policy_version INTEGER,
    n_prompt INTEGER NOT NULL,
    n_sampled INTEGER NOT NULL,
    flags TEXT NOT NULL,
    tags TEXT NOT NULL,
    prompt_base TEXT,
    prompt_prefix_len INTEGER NOT NULL,
    prompt_suffix BLOB NOT NULL,
    sampled BLOB NOT NULL,
    logprobs BLOB,
    body BLOB NOT NULL,
    harness_ids TEXT
);
CREATE INDEX IF NOT EXISTS completions_by_session ON completions (session_id, seq);
-- The tool-call ids each harness was given (CaptureRecord.harness_call_ids), the model's own.
CREATE TABLE IF NOT EXISTS call_ids (
    session_id TEXT NOT NULL, call_id TEXT NOT NULL, model_call_id TEXT NOT NULL,
    PRIMARY KEY (session_id, call_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replies (
    reply_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    completion_id TEXT NOT NULL,
    body BLOB NOT NULL
);
"""

# Columns added after the first stores were written: (name, SQL type), appended in this order.
_ADDED_COLUMNS = (("harness_ids", "TEXT"),)


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """Migrates a store written before a column existed: the column is appended (NULL in the old
    rows, which read as before). Two connections may race to add it; the loser finds it there."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(completions)")}
    for name, kind in _ADDED_COLUMNS:
        if name in have:
            continue
        try:
            conn.execute(f"ALTER TABLE completions ADD COLUMN {name} {kind}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc).lower():
                raise


def create_or_migrate(conn: sqlite3.Connection) -> None:
    """The tables, created when missing, with every column this version writes."""
    conn.executescript(SCHEMA)
    _add_missing_columns(conn)
