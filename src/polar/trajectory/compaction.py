"""Compactions among a session's calls: the request for a summary, and the history carrying it.

A harness compacts a long conversation in two calls. The first asks the model to summarise the
history: Claude Code appends the request to the conversation (its prompt extends the old one),
Codex sends the history without its tools (its prompt extends no earlier prompt). The second
opens a new, shorter history that carries the summary: Claude Code's starts "This session is
being continued from a previous conversation...", Codex's keeps the first messages and closes
with its summary message, and Codex's ``x-codex-window-id`` goes up by one. This module reads
that evidence from one call (and the call before it); trajectory/lineage.py places the calls in
the session tree. The phrases are those of Codex 0.169.0 and Claude Code 2.1.197.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar.capture.records import CaptureRecord
from polar.schemas.trajectory import CompactionEvidence
from polar.trajectory.messages import content_text, messages, reply_text

SUMMARY_REQUESTS = {
    # Codex's compact prompt (a ``compact_prompt`` of the user's config replaces it; then the
    # header or the carried reply tells)
    "you are performing a context checkpoint compaction": CompactionEvidence.CODEX_SUMMARY_PROMPT,
}
"""Phrases (lower case) of the user message that asks for the summary."""

CONTINUATIONS = {
    "continued from a previous conversation": CompactionEvidence.CLAUDE_CODE_CONTINUATION,
    "produced a summary of its thinking": CompactionEvidence.CODEX_SUMMARY_MESSAGE,
}
"""Phrases (lower case) of the message that carries the summary in the compacted history."""

CODEX_COMPACT_SUBAGENT = "compact"  # Codex's x-openai-subagent on a compaction request
MIN_CARRIED = 16  # a shorter reply found in a summary message is no evidence it is the summary


def summary_request(call: CaptureRecord) -> list[CompactionEvidence]:
    """Why ``call`` asks the model to summarise its history (empty: it does not)."""
    users = [m for m in messages(call) if m.get("role") == "user"]
    last = content_text(users[-1].get("content")).lower() if users else ""
    evidence = [e for phrase, e in SUMMARY_REQUESTS.items() if phrase in last]
    ids = call.harness_ids
    if ids is not None and ids.subagent == CODEX_COMPACT_SUBAGENT:
        evidence.append(CompactionEvidence.CODEX_COMPACT_HEADER)
    return evidence


def summary_messages(call: CaptureRecord) -> dict[str, CompactionEvidence]:
    """The texts of ``call``'s messages that carry a compaction summary, each with its marker."""
    out: dict[str, CompactionEvidence] = {}
    for message in messages(call):
        if message.get("role") not in ("system", "developer", "user"):
            continue
        text = content_text(message.get("content"))
        lower = text.lower()
        for phrase, evidence in CONTINUATIONS.items():
            if phrase in lower:
                out[text] = evidence
    return out


def continuation(
    call: CaptureRecord, parent: CaptureRecord, window_advanced: bool
) -> list[CompactionEvidence]:
    """Why ``call`` is a compacted history replacing ``parent``'s (empty: it is not): it
    carries a summary ``parent`` does not (a second compaction's summary is a new text), or
    its Codex context window is the next one."""
    before = summary_messages(parent)
    evidence = sorted(
        {e for text, e in summary_messages(call).items() if text not in before},
        key=list(CompactionEvidence).index,
    )
    if window_advanced:
        evidence.append(CompactionEvidence.CODEX_WINDOW)
    return evidence


def carried_summary(call: CaptureRecord, candidates: Sequence[CaptureRecord]) -> str | None:
    """The latest of ``candidates`` whose reply ``call``'s summary message carries verbatim."""
    texts = list(summary_messages(call))
    for earlier in reversed(candidates):
        reply = reply_text(earlier)
        if len(reply) < MIN_CARRIED and not summary_request(earlier):
            continue
        if reply and not earlier.response.get("tool_calls") and any(reply in t for t in texts):
            return earlier.completion_id
    return None
