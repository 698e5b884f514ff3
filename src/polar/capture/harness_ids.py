"""The ids agent CLIs put on their request headers to label their own agents and sub-agents.

Only an allow-list of header names is ever read (never an auth header, never a free-form
metadata blob), and each CLI's set is read into one :class:`HarnessIds`, kept on the capture
record so the session tree can be built from the CLI's own word (see trajectory/lineage.py):

- Claude Code (2.1.197): ``x-claude-code-session-id`` on every call; a sub-agent's calls add
  ``x-claude-code-agent-id`` and, when spawned by another sub-agent,
  ``x-claude-code-parent-agent-id``. The main agent is known by the session id.
- Codex (0.169.0): ``session-id`` (older: ``session_id``) shared by every thread of a session,
  ``thread-id`` per agent (the root thread's equals the session id), and for a spawned thread
  ``x-codex-parent-thread-id`` and ``x-openai-subagent`` (its kind: ``review``, ``compact``,
  ``collab_spawn`` ...); ``x-codex-window-id`` (``thread:generation``) is kept as sent.
- opencode (1.18.33): ``x-session-id`` per opencode session, and a child session's
  ``x-parent-session-id``.
"""

from __future__ import annotations

from collections.abc import Mapping

from polar.schemas.harness_ids import HarnessIds

# Each CLI's header names, in the order they are tried; nothing else is ever kept.
CLAUDE_CODE_HEADERS = (
    "x-claude-code-session-id",
    "x-claude-code-agent-id",
    "x-claude-code-parent-agent-id",
)
CODEX_HEADERS = (
    "session-id",
    "session_id",
    "thread-id",
    "thread_id",
    "x-codex-parent-thread-id",
    "x-openai-subagent",
    "x-codex-window-id",
)
OPENCODE_HEADERS = ("x-session-id", "x-parent-session-id")
LINEAGE_HEADERS = CLAUDE_CODE_HEADERS + CODEX_HEADERS + OPENCODE_HEADERS
MAX_VALUE = 200  # longer values are not ids: left out


def harness_ids(headers: Mapping[str, str]) -> HarnessIds | None:
    """The CLI ids on a request's headers, or None when it carries none of them."""
    kept = {
        name: value
        for name, value in ((k.lower(), v) for k, v in headers.items())
        if name in LINEAGE_HEADERS and isinstance(value, str) and 0 < len(value) <= MAX_VALUE
    }
    if not kept:
        return None
    if any(name in kept for name in CLAUDE_CODE_HEADERS):
        return _claude_code(kept)
    if any(name in kept for name in CODEX_HEADERS):
        return _codex(kept)
    return _opencode(kept)


def _claude_code(kept: dict[str, str]) -> HarnessIds | None:
    session = kept.get("x-claude-code-session-id")
    agent = kept.get("x-claude-code-agent-id")
    parent = kept.get("x-claude-code-parent-agent-id")
    if agent is not None and parent is None:
        parent = session  # spawned by the main agent, which is known by the session id
    agent = agent or session
    if agent is None:
        return None
    headers = _only(kept, CLAUDE_CODE_HEADERS)
    return HarnessIds(
        cli="claude_code", agent=agent, parent=parent, session=session, headers=headers
    )


def _codex(kept: dict[str, str]) -> HarnessIds | None:
    session = kept.get("session-id") or kept.get("session_id")
    agent = kept.get("thread-id") or kept.get("thread_id") or session
    if agent is None:
        return None
    return HarnessIds(
        cli="codex",
        agent=agent,
        parent=kept.get("x-codex-parent-thread-id"),
        session=session,
        subagent=kept.get("x-openai-subagent"),
        headers=_only(kept, CODEX_HEADERS),
    )


def _opencode(kept: dict[str, str]) -> HarnessIds | None:
    agent = kept.get("x-session-id")
    if agent is None:
        return None
    return HarnessIds(
        cli="opencode",
        agent=agent,
        parent=kept.get("x-parent-session-id"),
        headers=_only(kept, OPENCODE_HEADERS),
    )


def _only(kept: dict[str, str], names: tuple[str, ...]) -> dict[str, str]:
    return {name: kept[name] for name in names if name in kept}
