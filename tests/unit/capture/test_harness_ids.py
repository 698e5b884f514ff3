"""The lineage headers each CLI sends, read into HarnessIds; durable in the capture store.

Header sets as the pinned CLIs send them: Codex 0.169.0's recorded from the wire (a root
thread; a spawned thread adds the parent thread and the sub-agent kind), Claude Code
2.1.197's and opencode 1.18.33's names as their binaries set them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from polar.capture.harness_ids import harness_ids
from polar.capture.store import CaptureStore
from polar.schemas.harness_ids import HarnessIds

from ..trajectory.sessions import record

CODEX_ROOT = {
    "authorization": "Bearer sk-polar-secret",
    "x-codex-beta-features": "remote_compaction_v2",
    "x-codex-window-id": "01a234e6-d8f5-7341-90cc-251cae9c778c:0",
    "x-codex-turn-metadata": '{"installation_id":"29992494","session_id":"01a234e6"}',
    "x-client-request-id": "01a234e6-d8f5-7341-90cc-251cae9c778c",
    "session-id": "01a234e6-d8f5-7341-90cc-251cae9c778c",
    "thread-id": "01a234e6-d8f5-7341-90cc-251cae9c778c",
    "originator": "codex_exec",
    "user-agent": "codex_exec/0.169.0 (Debian 12.0.0; x86_64) xterm (codex_exec; 0.169.0)",
}
CODEX_REVIEW = {
    **CODEX_ROOT,
    "thread-id": "01a234e7-0000-7000-8000-00000000beef",
    "x-codex-parent-thread-id": "01a234e6-d8f5-7341-90cc-251cae9c778c",
    "x-openai-subagent": "review",
}
CLAUDE_MAIN = {
    "X-Claude-Code-Session-Id": "5f0c2a4e-1111-4a2b-9c3d-000000000001",
    "x-api-key": "sk-ant-secret",
    "x-app": "cli",
    "anthropic-version": "2023-06-01",
}
CLAUDE_SUB = {**CLAUDE_MAIN, "x-claude-code-agent-id": "a1b2c3"}
CLAUDE_NESTED = {
    **CLAUDE_SUB,
    "x-claude-code-agent-id": "d4e5f6",
    "x-claude-code-parent-agent-id": "a1b2c3",
}
OPENCODE_MAIN = {
    "x-session-affinity": "ses_2f1a",
    "X-Session-Id": "ses_2f1a",
    "authorization": "Bearer k",
}
OPENCODE_CHILD = {
    "x-session-affinity": "ses_9c7e",
    "X-Session-Id": "ses_9c7e",
    "x-parent-session-id": "ses_2f1a",
}


@pytest.mark.parametrize(
    ("headers", "cli", "agent", "parent", "subagent"),
    [
        (CODEX_ROOT, "codex", CODEX_ROOT["thread-id"], None, None),
        (CODEX_REVIEW, "codex", CODEX_REVIEW["thread-id"], CODEX_ROOT["thread-id"], "review"),
        (
            {"session_id": "s-old", "authorization": "Bearer k"},  # older Codex: session_id only
            "codex",
            "s-old",
            None,
            None,
        ),
        (CLAUDE_MAIN, "claude_code", CLAUDE_MAIN["X-Claude-Code-Session-Id"], None, None),
        # spawned by the main agent: its parent is the main agent, known by the session id
        (CLAUDE_SUB, "claude_code", "a1b2c3", CLAUDE_MAIN["X-Claude-Code-Session-Id"], None),
        (CLAUDE_NESTED, "claude_code", "d4e5f6", "a1b2c3", None),
        (OPENCODE_MAIN, "opencode", "ses_2f1a", None, None),
        (OPENCODE_CHILD, "opencode", "ses_9c7e", "ses_2f1a", None),
    ],
)
def test_each_clis_headers_name_its_agent(headers, cli, agent, parent, subagent) -> None:
    ids = harness_ids(headers)
    assert ids is not None
    assert (ids.cli, ids.agent, ids.parent, ids.subagent) == (cli, agent, parent, subagent)
    # only allow-listed names are kept: never an auth header, never Codex's metadata blob
    kept = set(ids.headers)
    assert kept <= {name.lower() for name in headers}
    assert not kept & {"authorization", "x-api-key", "x-codex-turn-metadata", "user-agent"}


def test_no_lineage_headers_no_ids_and_long_values_are_not_ids() -> None:
    assert harness_ids({"authorization": "Bearer k", "content-type": "application/json"}) is None
    assert harness_ids({"x-session-id": "x" * 201}) is None
    kept = harness_ids({"session-id": "s", "thread-id": "t" * 500})
    assert kept is not None and (kept.agent, kept.headers) == ("s", {"session-id": "s"})


def test_ids_are_durable_and_old_stores_migrate(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    store = CaptureStore(db)
    ids = harness_ids(CODEX_REVIEW)
    new = record([1, 2, 3], [4, 99]).model_copy(update={"harness_ids": ids})
    old = record([1, 2, 3], [5, 99])

    async def write() -> None:
        await store.append(old)
        await store.append(new)

    asyncio.run(write())
    store.close()
    back = {r.completion_id: r for r in CaptureStore(db).records("sess")}
    assert back[new.completion_id].harness_ids == ids
    assert back[old.completion_id].harness_ids is None


def test_a_store_from_before_the_column_gains_it_and_reads_as_before(tmp_path: Path) -> None:
    db = tmp_path / "before.db"
    store = CaptureStore(db)
    old = record([1, 2, 3], [5, 99])

    asyncio.run(store.append(old))
    store.close()
    # undo the column, as a store written by an earlier version has none
    conn = sqlite3.connect(db)
    conn.execute("ALTER TABLE completions DROP COLUMN harness_ids")
    conn.commit()
    conn.close()
    reopened = CaptureStore(db)
    (back,) = reopened.records("sess")
    assert back.completion_id == old.completion_id and back.harness_ids is None
    columns = [row[1] for row in sqlite3.connect(db).execute("PRAGMA table_info(completions)")]
    assert columns[-1] == "harness_ids"
    new = record([1, 2, 3], [6, 99]).model_copy(
        update={"harness_ids": HarnessIds(cli="opencode", agent="ses_1")}
    )
    asyncio.run(reopened.append(new))
    assert reopened.records("sess")[-1].harness_ids == new.harness_ids
    reopened.close()
