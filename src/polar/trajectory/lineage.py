"""The session tree: how each captured call relates to the calls before it.

Builders decide how calls merge into traces; this module decides, from the calls alone, why
each call exists, so every builder labels its traces the same way. A call's parent is the earlier
call whose prompt shares the longest token prefix with its prompt (ties: the one whose reply the
prompt re-renders, then the latest). From that prefix relation:

- it extends the parent's prompt: the same agent goes on (``continues``);
- its prompt equals (or ends within) the parent's: a second attempt; a ``retry`` when the first
  attempt was abandoned (no later call continues it; its sampled ids are then masked), else a
  parallel ``branch``;
- it asks for a summary of its history without extending it (Codex's compaction request, sent
  without the tools): a ``compaction`` trace of its own (step ``summary``) whose parent call is
  the latest call whose messages its history extends;
- it diverges and carries a compaction summary its parent does not (Claude Code's continued
  session, Codex's summary message), or is the first call of Codex's next context window: a
  ``compaction`` (step ``continuation``), wherever it diverges; its parent call is the last
  call of the compacted history, and ``summary_call`` the call whose reply it carries;
- it diverges after the parent's agent's first messages: that agent's history was rewritten;
- it diverges earlier (at most the system prompt shared): a new agent, a ``subagent`` (Claude
  Code's sub-agent system prompt is named as the evidence when present).

When the harness CLI labels its agents on the request headers (``CaptureRecord.harness_ids``:
Claude Code's agent ids, Codex's thread ids, opencode's session ids), those ids decide which
agent each call belongs to and which agent spawned it; the prefix relation above stays the
fallback for calls without them and the cross-check for calls with them. Where the two agree,
the prefix's link stands (its kind and reason; a sub-agent's parent call is the latest call of
the agent the ids name as its parent); where they differ, the ids decide (reason
``harness_headers``) and the call carries a :class:`LineageDisagreement` naming both views.

Cost: about linear in the session's prompt tokens: earlier prompts are found by hashes of
their leading blocks (:class:`_PrefixIndex`), and only those sharing the most blocks are
compared token by token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from polar.capture.records import CaptureRecord
from polar.schemas.harness_ids import HarnessIds
from polar.schemas.trajectory import (
    CompactionEvidence,
    CompactionLink,
    CompactionStep,
    LineageDisagreement,
    TraceKind,
)
from polar.trajectory.compaction import carried_summary, continuation, summary_request
from polar.trajectory.messages import content_text, first_user_text, messages, reply_call_strings

NATURAL_STOPS = ("stop", "tool_calls")
CLAUDE_CODE_SUBAGENT = "You are an agent for Claude Code"


class Relation(StrEnum):
    FIRST = "first"
    CONTINUES = "continues"
    REWRITES = "rewrites"
    RETRY = "retry"
    BRANCH = "branch"
    SUMMARY = "summary"  # the same agent asked to summarise its history, which it does not extend
    NEW_AGENT = "new_agent"


@dataclass(frozen=True)
class CallLink:
    """One call's place in the tree: its parent call, how it relates, its agent's role."""

    parent: str | None
    relation: Relation
    role: TraceKind
    reason: str
    harness: HarnessIds | None = None  # the call's agent by its CLI's own ids
    disagreement: LineageDisagreement | None = None  # ids and prefixes placed it apart
    compaction: CompactionLink | None = None  # its part in a compaction, if it has one

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
    windows = _next_windows(calls)
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
        asks = summary_request(call) if len(q) else []
        if (p is None or not len(q)) and not asks:
            kind, reason = _new_agent_role(call)
            reason = reason if len(q) else "prompt_ids_missing"
            links[call.completion_id] = CallLink(None, Relation.NEW_AGENT, kind, reason)
            roots.append(i)
            continue
        if p is None:
            links[call.completion_id] = _summary_link(i, calls, None, asks)
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
        elif asks:
            link = _summary_link(i, calls, parent.completion_id, asks)
            roots.append(i)
        elif evidence := continuation(call, parent, i in windows):
            link = _continuation_link(parent.completion_id, evidence)
            roots.append(i)
        elif shared >= _anchor(prompts[roots[p]], eot):
            link = CallLink(parent.completion_id, Relation.REWRITES, role, "history_rewritten")
            roots.append(roots[p])
        else:
            kind, reason = _new_agent_role(call)
            link = CallLink(parent.completion_id, Relation.NEW_AGENT, kind, reason)
            roots.append(i)
        links[call.completion_id] = link
    _tie_summaries(calls, links)
    return SessionTree(_by_harness_ids(calls, links), frozenset(abandoned))


def _next_windows(calls: Sequence[CaptureRecord]) -> set[int]:
    """Indices of the calls that open their Codex thread's next context window (its
    ``x-codex-window-id`` number above the thread's calls before it): a compaction's
    compacted history starts there."""
    seen: dict[str, int] = {}
    out: set[int] = set()
    for i, call in enumerate(calls):
        ids = call.harness_ids
        window = ids.window if ids is not None else None
        if ids is None or window is None:
            continue
        before = seen.get(ids.agent)
        if before is not None and window > before:
            out.add(i)
        seen[ids.agent] = window if before is None else max(window, before)
    return out


def _summary_link(
    i: int, calls: Sequence[CaptureRecord], fallback: str | None, asks: list[CompactionEvidence]
) -> CallLink:
    """A summary request standing apart from its history: its parent is the latest call whose
    messages that history extends (the prompt prefix cannot tell: the tools are gone)."""
    parent = _summarised(i, calls) or fallback
    step = CompactionLink(step=CompactionStep.SUMMARY, evidence=asks)
    return CallLink(
        parent, Relation.SUMMARY, TraceKind.COMPACTION, "summary_request", compaction=step
    )


def _continuation_link(parent: str, evidence: list[CompactionEvidence]) -> CallLink:
    marked = any(e is not CompactionEvidence.CODEX_WINDOW for e in evidence)
    step = CompactionLink(step=CompactionStep.CONTINUATION, evidence=evidence)
    reason = "summary_marker" if marked else "codex_window"
    return CallLink(parent, Relation.NEW_AGENT, TraceKind.COMPACTION, reason, compaction=step)


def _summarised(i: int, calls: Sequence[CaptureRecord]) -> str | None:
    """The latest earlier call with the most messages that call ``i``'s messages start with."""
    history = messages(calls[i])
    best: tuple[int, int] | None = None
    for j in range(i):
        earlier = messages(calls[j])
        n = len(earlier)
        if 0 < n < len(history) and history[:n] == earlier and (best is None or n >= best[0]):
            best = (n, j)
    return calls[best[1]].completion_id if best is not None else None


def _tie_summaries(calls: Sequence[CaptureRecord], links: dict[str, CallLink]) -> None:
    """Each compacted history's summary call: the latest earlier call whose reply it carries
    (summary requests first, then calls of the same agent). Its parent call becomes the last
    call of the compacted history; a call found only by its carried reply that stands apart
    from its history becomes the summary request it was (Codex with its own compact_prompt)."""
    order = {c.completion_id: i for i, c in enumerate(calls)}
    for i, call in enumerate(calls):
        link = links[call.completion_id]
        if link.compaction is None or link.compaction.step is not CompactionStep.CONTINUATION:
            continue
        earlier = calls[:i]
        asked = [c for c in earlier if _is_summary(links[c.completion_id], c)]
        found = carried_summary(call, asked) or carried_summary(call, _same_agent(call, earlier))
        if found is None:
            continue
        summary = links[found]
        apart = summary.relation in (Relation.REWRITES, Relation.NEW_AGENT)
        if apart and summary.compaction is None:
            carried = [CompactionEvidence.SUMMARY_CARRIED]
            summary = _summary_link(order[found], calls, summary.parent, carried)
            links[found] = summary
        compacted = summary.parent if summary.relation is Relation.SUMMARY else found
        step = link.compaction.model_copy(update={"summary_call": found})
        links[call.completion_id] = replace(link, parent=compacted or link.parent, compaction=step)


def _is_summary(link: CallLink, call: CaptureRecord) -> bool:
    return link.relation is Relation.SUMMARY or bool(summary_request(call))


def _same_agent(call: CaptureRecord, earlier: Sequence[CaptureRecord]) -> list[CaptureRecord]:
    """The earlier calls of ``call``'s agent by its CLI's ids (all of them without ids)."""
    if call.harness_ids is None:
        return list(earlier)
    agent = call.harness_ids.agent
    return [c for c in earlier if c.harness_ids is not None and c.harness_ids.agent == agent]


HEADERS_DECIDED = "harness_headers"


def _by_harness_ids(
    calls: Sequence[CaptureRecord], links: dict[str, CallLink]
) -> dict[str, CallLink]:
    """The prefix links checked against, and where they differ overruled by, the agent ids
    the CLI put on each call's headers (calls without ids keep their prefix link)."""
    if not any(c.harness_ids for c in calls):
        return links
    agent_of: dict[str, str] = {}  # completion id -> its agent by the ids
    latest: dict[str, str] = {}  # agent -> its latest call so far
    out: dict[str, CallLink] = {}
    for call in calls:
        cid, link, ids = call.completion_id, links[call.completion_id], call.harness_ids
        if ids is None:
            out[cid] = link
            continue
        prefix_agent = agent_of.get(link.parent) if link.parent is not None else None
        if ids.agent in latest:  # the agent goes on
            own = latest[ids.agent]
            new_agent = (
                link.relation is Relation.NEW_AGENT and link.role is not TraceKind.COMPACTION
            )
            agrees = link.parent is not None and prefix_agent in (ids.agent, None) and not new_agent
            decided = CallLink(own, Relation.REWRITES, out[own].role, HEADERS_DECIDED)
        elif ids.parent is None:  # a root agent
            agrees = link.relation in (Relation.FIRST, Relation.NEW_AGENT)
            decided = CallLink(None, Relation.NEW_AGENT, TraceKind.MAIN, HEADERS_DECIDED)
        else:  # a sub-agent's first call: its parent call is the spawner's call that
            # spawned it (a call whose tool call carries its prompt: a background sub-agent may
            # start after its spawner's next call), else the spawner's latest
            spawner = _spawning_call(
                call, [c for c in calls if agent_of.get(c.completion_id) == ids.parent]
            ) or latest.get(ids.parent, link.parent)
            # A spawner with no call here (``codex exec review``: the root thread only starts
            # the review) leaves the sub-agent's first call the session's first, by both views.
            unseen_spawner = link.relation is Relation.FIRST and ids.parent not in latest
            new_by_prefix = link.relation is Relation.NEW_AGENT or unseen_spawner
            agrees = new_by_prefix and prefix_agent in (ids.parent, None)
            decided = CallLink(spawner, Relation.NEW_AGENT, TraceKind.SUBAGENT, HEADERS_DECIDED)
            if agrees:
                link = replace(link, parent=spawner, role=TraceKind.SUBAGENT)
        if agrees:
            out[cid] = replace(link, harness=ids)
        else:
            disagreement = LineageDisagreement(
                completion_id=cid,
                by_headers=decided.relation.value,
                headers_parent_call=decided.parent,
                by_prefix=link.relation.value,
                prefix_parent_call=link.parent,
            )
            out[cid] = replace(decided, harness=ids, disagreement=disagreement)
        agent_of[cid] = ids.agent
        latest[ids.agent] = cid
    return out


MIN_PROMPT_CHARS = 16  # a shorter tool-call argument names nothing: never a prompt match


def _spawning_call(call: CaptureRecord, spawner_calls: Sequence[CaptureRecord]) -> str | None:
    """The latest of ``spawner_calls`` whose reply carries a tool call with the sub-agent's
    prompt (a string argument its first user message holds), or None."""
    text = first_user_text(call)
    for earlier in reversed(spawner_calls):
        prompts = [s for s in reply_call_strings(earlier) if len(s) >= MIN_PROMPT_CHARS]
        if any(prompt in text for prompt in prompts):
            return earlier.completion_id
    return None


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
    for message in messages(call):
        role = message.get("role")
        if role == "user":
            users += 1
        if role not in ("system", "developer", "user") or (first_user_only and users > 1):
            continue
        out.append(content_text(message.get("content")))
    return "\n".join(out)
