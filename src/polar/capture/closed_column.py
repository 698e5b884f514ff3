"""The capture store's one migration so far: a session's closed state moved from a key of its
JSON to a column of its row (kept apart from store.py so that module stays under 600 lines)."""

from __future__ import annotations

import sqlite3

import orjson


def add_closed_column(conn: sqlite3.Connection) -> None:
    """Brings a store from before the ``closed`` column up to it: the column is added, and
    filled from the ``"closed"`` key its sessions' JSON held then (the key stays, unread). In
    one transaction, so a second connection finds the column there and filled."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if all(row[1] != "closed" for row in conn.execute("PRAGMA table_info(sessions)")):
            conn.execute("ALTER TABLE sessions ADD COLUMN closed INTEGER NOT NULL DEFAULT 0")
            rows = conn.execute("SELECT session_id, metadata FROM sessions").fetchall()
            closed = [(sid,) for sid, meta in rows if orjson.loads(meta).get("closed") is True]
            conn.executemany("UPDATE sessions SET closed = 1 WHERE session_id = ?", closed)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
