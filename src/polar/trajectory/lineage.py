"""The session tree: how each captured call relates to the calls before it.

Builders decide how calls merge into traces; this module decides, from the calls alone, why
each call exists, so every builder labels its traces the same way. A call's parent is the earlier
call whose prompt shares the longest token prefix with its prompt (ties: the one whose reply the
prompt re-renders, then the latest). From that prefix relation:

- it extends the parent's prompt: the same agent goes on (``continues``);
- its prompt equals (or ends within) the parent's: a second attempt; a ``retry`` when the first
  attempt was abandoned (no later call continues it; its sampled ids are then masked), else a
  parallel ``branch``;
- it diverges and carries a compaction summary its parent does not (Claude Code's continued
  session, Codex's summary message): a ``compaction``, a new agent, wherever it diverges;
- it diverges after the parent's agent's first messages: that agent's history was rewritten;
- it diverges earlier (at most the system prompt shared): a new agent, a ``subagent`` (Claude
  Code's sub-agent system prompt is named as the evidence when present).

Cost: about linear in the session's prompt tokens: earlier prompts are found by hashes of
their leading blocks (:class:`_PrefixIndex`), and only those sharing the most blocks are
compared token by token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from polar.capture.records import CaptureRecord
from polar.schemas.trajectory import TraceKind

NATURAL_STOPS = ("stop", "tool_calls")

# Phrases harnesses put at the head of a compacted conversation (lower case).
# Phrases harnesses put in the conversation that replaces a compacted one (lower case); not
# those of the request asking for the summary, which merely extends the old conversation.
COMPACTION_MARKERS = (
    "continued from a previous conversation",  # Claude Code: the continued session's first turn
    "produced a summary of its thinking",  # Codex: the summary message closing the new history
)
CLAUDE_CODE_SUBAGENT = "You are an agent for Claude Code"


class Relation(StrEnum):
    FIRST = "first"
    CONTINUES = "continues"
    REWRITES = "rewrites"
    RETRY = "retry"
    BRANCH = "branch"
    NEW_AGENT = "new_agent"


@dataclass(frozen=True)
class CallLink:
    """One call's place in the tree: its parent call, how it relates, its agent's role."""

    parent: str | None
    relation: Relation
    role: TraceKind
    reason: str

    @property
    def kind(self) -> TraceKind:
        """The trace kind a trace starting at this call gets."""
        if self.relation is Relation.RETRY:
            return TraceKind.RETRY
        if self.relation is Relation.BRANCH:
            return TraceKind.BRANCH
        return self.role


@dataclass(frozen=True)
class SessionTree:
    links: dict[str, CallLink]
    abandoned: frozenset[str]
    """Completion ids of attempts a retry replaced (their sampled ids are masked)."""


def learn_eot(calls: Sequence[CaptureRecord]) -> int | None:
    """The last sampled id of the first call that stopped on its own (not on length)."""
    for record in calls:
        if record.finish_reason in NATURAL_STOPS and record.sampled_ids:
            return record.sampled_ids[-1]
    return None


def session_tree(calls: Sequence[CaptureRecord], eot: int | None) -> SessionTree:
    """Link every call (time order) to its parent; see the module docstring for the rules."""
    prompts = [np.asarray(c.prompt_ids, dtype=np.int64) for c in calls]
    index = _PrefixIndex()
    parents = []
    for i in range(len(calls)):
        parents.append(_parent(i, calls, prompts, index))
        index.add(i, prompts[i])
    continued = {
        p
        for i, (p, shared) in enumerate(parents)
        if p is not None and shared == len(prompts[p]) < len(prompts[i])
    }
    links: dict[str, CallLink] = {}
    roots: list[int] = []
    abandoned: set[str] = set()
    for i, (call, (p, shared)) in enumerate(zip(calls, parents, strict=True)):
        q = prompts[i]
        if i == 0:
            links[call.completion_id] = CallLink(None, Relation.FIRST, TraceKind.MAIN, "first_call")
            roots.append(i)
            continue
        if p is None or not len(q):
            kind, reason = _new_agent_role(call)
            reason = reason if len(q) else "prompt_ids_missing"
            links[call.completion_id] = CallLink(None, Relation.NEW_AGENT, kind, reason)
            roots.append(i)
            continue
        parent = calls[p]
        role = links[parent.completion_id].role
        if shared == len(q):
            attempt = _attempt(i, q, prompts, p)
            if attempt in continued:
                link = CallLink(
                    calls[attempt].completion_id, Relation.BRANCH, role, "same_prompt_continued"
                )
            else:
                abandoned.add(calls[attempt].completion_id)
                link = CallLink(
                    calls[attempt].completion_id, Relation.RETRY, role, "same_prompt_abandoned"
                )
            roots.append(roots[attempt])
        elif shared == len(prompts[p]):
            link = CallLink(parent.completion_id, Relation.CONTINUES, role, "extends_prompt")
            roots.append(roots[p])
        elif _compacts(call, parent):
            kind, reason = TraceKind.COMPACTION, "summary_marker"
            link = CallLink(parent.completion_id, Relation.NEW_AGENT, kind, reason)
            roots.append(i)
        elif shared >= _anchor(prompts[roots[p]], eot):
            link = CallLink(parent.completion_id, Relation.REWRITES, role, "history_rewritten")
            roots.append(roots[p])
        else:
            kind, reason = _new_agent_role(call)
            link = CallLink(parent.completion_id, Relation.NEW_AGENT, kind, reason)
            roots.append(i)
        links[call.completion_id] = link
    return SessionTree(links, frozenset(abandoned))


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays (vectorized)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class _PrefixIndex:
    """Earlier prompts by the hash of each whole block of ``BLOCK`` leading tokens.

    Sharing a prefix is monotone (sharing k blocks implies sharing fewer), so a binary search
    over a prompt's block hashes finds how many whole blocks the best earlier prompt shares,
    and only the prompts sharing that many are compared token by token, within one block: a
    call costs about its length, not its length times the number of earlier calls.
    """

    def __init__(self) -> None:
        self.by_key: dict[bytes, list[int]] = {}
        self.seen: list[int] = []

    def add(self, i: int, prompt: np.ndarray) -> None:
        for key in _block_keys(prompt):
            self.by_key.setdefault(key, []).append(i)
        self.seen.append(i)

    def candidates(self, prompt: np.ndarray) -> tuple[list[int], int]:
        """Earlier calls sharing the most whole blocks with ``prompt``, and that many tokens."""
        keys = _block_keys(prompt)
        low, high = 0, len(keys)  # blocks shared: at least low, at most high
        while low < high:
            mid = (low + high + 1) // 2
            if keys[mid - 1] in self.by_key:
                low = mid
            else:
                high = mid - 1
        return (self.by_key[keys[low - 1]] if low else self.seen), low * BLOCK


BLOCK = 256


def _block_keys(prompt: np.ndarray) -> list[bytes]:
    """A digest of each whole-block prefix of ``prompt`` (its first 1, 2, ... blocks)."""
    data = prompt.tobytes()
    size = BLOCK * prompt.itemsize
    digest = hashlib.blake2b(digest_size=16)
    keys = []
    for b in range(len(prompt) // BLOCK):
        digest.update(data[b * size : (b + 1) * size])
        keys.append(digest.digest())
    return keys


def _parent(
    i: int, calls: Sequence[CaptureRecord], prompts: list[np.ndarray], index: _PrefixIndex
) -> tuple[int | None, int]:
    """The earlier call sharing the longest prompt prefix with call ``i``, and that length."""
    q = prompts[i]
    candidates, skip = index.candidates(q)
    best: tuple[int, bool, int] | None = None
    for j in candidates:
        shared = skip + common_prefix(prompts[j][skip:], q[skip:])
        if not shared:
            continue
        key = (shared, _renders(prompts[j], calls[j].sampled_ids, q), j)
        if best is None or key > best:
            best = key
    return (best[2], best[0]) if best is not None else (None, 0)


def _renders(prompt: np.ndarray, sampled: list[int], q: np.ndarray) -> bool:
    """Whether ``q`` holds ``sampled`` right after ``prompt`` (the last id, often the turn
    end the template re-renders differently, aside)."""
    n = len(prompt)
    head = sampled[: max(1, len(sampled) - 1)]
    return bool(sampled) and len(q) >= n + len(head) and q[n : n + len(head)].tolist() == head


def _attempt(i: int, q: np.ndarray, prompts: list[np.ndarray], fallback: int) -> int:
    """The latest earlier call whose prompt equals ``q``: the attempt call ``i`` repeats."""
    for j in range(i - 1, -1, -1):
        if len(prompts[j]) == len(q) and np.array_equal(prompts[j], q):
            return j
    return fallback


def _anchor(prompt: np.ndarray, eot: int | None) -> int:
    """Where an agent's first prompt's last message ends (its generation-prompt glue aside)."""
    if eot is None:
        return len(prompt)
    ends = np.flatnonzero(prompt == eot)
    return int(ends[-1]) + 1 if len(ends) else len(prompt)


def _compacts(call: CaptureRecord, parent: CaptureRecord) -> bool:
    """Whether ``call``'s conversation carries a compaction summary its parent's does not.

    Codex keeps the first messages and appends the summary, so a compacted conversation may
    share far more than the system prompt with the one it replaces."""
    return _has_marker(call) and not _has_marker(parent)


def _has_marker(call: CaptureRecord) -> bool:
    texts = _texts(call, first_user_only=False).lower()
    return any(marker in texts for marker in COMPACTION_MARKERS)


def _new_agent_role(call: CaptureRecord) -> tuple[TraceKind, str]:
    text = _texts(call).lower()
    if CLAUDE_CODE_SUBAGENT.lower() in text:
        return TraceKind.SUBAGENT, "claude_code_subagent_prompt"
    return TraceKind.SUBAGENT, "shares_only_system_prefix"


def _texts(call: CaptureRecord, *, first_user_only: bool = True) -> str:
    """The system and user message texts of a call (normalized chat messages): those up to the
    first user message, or all of them."""
    out: list[str] = []
    users = 0
    for message in call.upstream_request.get("messages") or []:
        role = message.get("role")
        if role == "user":
            users += 1
        if role not in ("system", "developer", "user") or (first_user_only and users > 1):
            continue
        out.append(content_text(message.get("content")))
    return "\n".join(out)


def content_text(content: Any) -> str:
    """The text of a chat message's content: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
