"""prefix_merging: calls whose prompts extend each other become one trace with a loss mask.

A call joins the chain whose latest prompt is a token prefix of its prompt (the longest such);
only the engine's prompt ids are compared, never re-tokenized text. Within a chain the first
prompt is the context, every sampled id is trainable with its own logprob, and the tokens the
harness and template put between two turns are masked. A step that cannot be merged starts a
new segment of the same chain with a recorded reason, so no captured call is ever dropped.

Cost: each prompt is converted to an array once and compared with each open chain's latest
prompt (a boundary check first, then one vectorized comparison); a chain keeps only its latest
prompt, and a trace holds only the tokens new to it, so memory follows the session's unique
tokens rather than the sum of its prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polar.capture.records import CaptureRecord
from polar.schemas.trajectory import TrajectoryStats
from polar.trajectory.base import (
    BREAK_CONTEXT_DRIFT,
    BREAK_PREFIX,
    BREAK_PROMPT_IDS_MISSING,
    BREAK_RETRY,
    Builder,
    BuilderConfig,
    Grouping,
    Segment,
)
from polar.trajectory.drift import SplitError, split_turn
from polar.trajectory.lineage import common_prefix, learn_eot
from polar.trajectory.template_repair import PromptView, RepairTokens, TemplateRepair


class PrefixMergingBuilder(Builder):
    """One trace per agent chain (more when a chain breaks), merged on token prefixes."""

    name = "prefix_merging"

    def __init__(
        self, config: BuilderConfig | Mapping[str, Any] | None = None, *, tokenizer: Any = None
    ) -> None:
        super().__init__(config)
        self.repair: TemplateRepair | None = None
        if self.config.template_repair:
            if tokenizer is None:
                from polar.rendering.model_files import load_tokenizer

                tokenizer = load_tokenizer(self.config.tokenizer)
            tokens = RepairTokens.from_tokenizer(tokenizer)
            self.repair = TemplateRepair(self.config.template_repair, tokens)

    def group(self, calls: list[CaptureRecord]) -> Grouping:
        eot, source = self.config.eot_token_id, "config"
        if eot is None:
            eot, source = learn_eot(calls), "learned"
        merger = _Merger(eot, self.repair, exact=self.config.context == "exact")
        for order, record in enumerate(calls):
            merger.add(order, record)
        return Grouping(
            merger.segments(),
            TrajectoryStats(
                eot_token_id=eot,
                eot_source=source if eot is not None else None,
                template_repair=list(self.config.template_repair),
            ),
        )


@dataclass
class _Chain:
    """One agent lineage while merging: its segments and the latest prompt it offers."""

    created: int
    anchor: int  # tokens a call must share with the first prompt to be the same conversation
    segments: list[Segment]
    prompt: np.ndarray
    view: PromptView | None
    sampled: np.ndarray
    last_active: int
    calls: list[tuple[int, str]] = field(default_factory=list)  # (prompt length, completion id)
    parent: _Chain | None = None
    reason: str | None = None
    fork_call: str | None = None
    owner: _Chain | None = None


@dataclass(frozen=True)
class _Match:
    chain: _Chain
    q_start: int
    length: int
    repaired_tokens: int


class _Merger:
    def __init__(self, eot: int | None, repair: TemplateRepair | None, *, exact: bool) -> None:
        self.eot = eot
        self.repair = repair
        self.exact = exact
        self.chains: list[_Chain] = []

    def add(self, order: int, record: CaptureRecord) -> None:
        q = np.asarray(record.prompt_ids, dtype=np.int64)
        sampled = np.asarray(record.sampled_ids, dtype=np.int64)
        if not len(q):
            # Without prompt ids nothing can be compared: a chain of its own, said why.
            self._open(order, record, q, None, sampled, reason=BREAK_PROMPT_IDS_MISSING)
            return
        view = self.repair.view(q) if self.repair else None
        match = self._best_match(q, view)
        if match is None:
            self._open_unmatched(order, record, q, view, sampled)
            return
        chain = match.chain
        try:
            split = split_turn(chain.sampled, q[match.q_start :], self.eot)
        except SplitError as exc:
            chain.segments.append(Segment([record], [[]], break_reason=exc.reason))
        else:
            if split.drift_tokens and self.exact:
                # The engine saw a re-rendering, not the sampled ids: merging would hand the
                # trainer a context this call never had. Drift is still counted, on the split.
                chain.segments.append(
                    Segment(
                        [record],
                        [[]],
                        break_reason=BREAK_CONTEXT_DRIFT,
                        drift_turns=1,
                        drift_tokens=split.drift_tokens,
                    )
                )
                self._advance(chain, order, record, q, view, sampled)
                return
            seg = chain.segments[-1]
            seg.records.append(record)
            seg.interstitials.append(q[match.q_start + split.skip :].tolist())
            if split.drift_tokens:
                seg.drift_turns += 1
                seg.drift_tokens += split.drift_tokens
            if match.repaired_tokens:
                seg.repaired_steps += 1
                seg.repaired_tokens += match.repaired_tokens
        self._advance(chain, order, record, q, view, sampled)

    def _best_match(self, q: np.ndarray, view: PromptView | None) -> _Match | None:
        matches = [m for c in self.chains if (m := self._match(c, q, view)) is not None]
        if not matches:
            return None
        longest = max(m.length for m in matches)
        tied = [m for m in matches if m.length == longest]
        # Equal prompts (retries, parallel samples): the chain whose reply the prompt really
        # re-renders wins, then the most recently active one.
        return max(tied, key=lambda m: (_renders(m, q), m.chain.last_active))

    def _match(self, chain: _Chain, q: np.ndarray, view: PromptView | None) -> _Match | None:
        """A strict token-prefix match, else (when rules are enabled) a repaired one."""
        p = chain.prompt
        n = len(p)
        if not n:
            return None
        if n < len(q) and p[-1] == q[n - 1] and p[0] == q[0] and np.array_equal(p, q[:n]):
            return _Match(chain, n, n, 0)
        if view is None or chain.view is None or self.repair is None:
            return None
        repaired = self.repair.match(chain.view, view)
        if repaired is None:
            return None
        return _Match(chain, repaired.q_start, repaired.canonical_len, repaired.repaired_tokens)

    def _open_unmatched(
        self,
        order: int,
        record: CaptureRecord,
        q: np.ndarray,
        view: PromptView | None,
        sampled: np.ndarray,
    ) -> None:
        """A call extending no chain: a retry, a rewrite of a chain's history, or a new agent.

        A call that shares every message of a chain's first prompt (all but its generation-prompt
        glue) is tied to that chain; whether it continues it (a break) or branches off it is
        decided at the end. Sub-agents and rewrites of the first conversation open new chains.
        """
        parent, shared = None, 0
        for chain in self.chains:
            if len(chain.prompt):
                n = common_prefix(chain.prompt, q)
                if n > shared:
                    parent, shared = chain, n
        if parent is None or (shared < parent.anchor and shared < len(q)):
            self._open(order, record, q, view, sampled)
            return
        same_prompt = shared == len(q) and any(n == len(q) for n, _ in parent.calls)
        reason = BREAK_RETRY if same_prompt else BREAK_PREFIX
        new = self._open(order, record, q, view, sampled, reason=reason)
        new.parent = parent
        new.fork_call = next(
            (cid for length, cid in reversed(parent.calls) if length <= shared),
            parent.calls[0][1],
        )

    def _open(
        self,
        order: int,
        record: CaptureRecord,
        q: np.ndarray,
        view: PromptView | None,
        sampled: np.ndarray,
        reason: str | None = None,
    ) -> _Chain:
        chain = _Chain(
            created=order,
            anchor=self._anchor(q),
            segments=[Segment([record], [[]])],
            prompt=q,
            view=view,
            sampled=sampled,
            last_active=order,
            calls=[(len(q), record.completion_id)],
            reason=reason,
        )
        if reason == BREAK_PROMPT_IDS_MISSING:
            chain.segments[0].break_reason = reason
        self.chains.append(chain)
        return chain

    def _anchor(self, q: np.ndarray) -> int:
        """Where the first prompt's last message ends (its generation-prompt glue excluded)."""
        if self.eot is None:
            return len(q)
        ends = np.flatnonzero(q == self.eot)
        return int(ends[-1]) + 1 if len(ends) else len(q)

    def _advance(
        self,
        chain: _Chain,
        order: int,
        record: CaptureRecord,
        q: np.ndarray,
        view: PromptView | None,
        sampled: np.ndarray,
    ) -> None:
        chain.prompt, chain.view, chain.sampled, chain.last_active = q, view, sampled, order
        chain.calls.append((len(q), record.completion_id))

    def segments(self) -> list[Segment]:
        """Fold tentative branches into their parent where the parent went no further."""
        roots: list[_Chain] = []
        for chain in self.chains:  # creation order: parents come first
            root = _resolve(chain.parent) if chain.parent is not None else None
            if root is not None and root.last_active < chain.created:
                chain.owner = root
                chain.segments[0].break_reason = chain.reason
                root.segments += chain.segments
                root.last_active = max(root.last_active, chain.last_active)
            else:
                if chain.parent is not None:
                    chain.segments[0].forked_from = chain.fork_call
                roots.append(chain)
        out: list[Segment] = []
        for index, root in enumerate(roots):
            for number, seg in enumerate(root.segments):
                seg.chain_index, seg.segment_index = index, number
                out.append(seg)
        return out


def _resolve(chain: _Chain) -> _Chain:
    while chain.owner is not None:
        chain = chain.owner
    return chain


def _renders(match: _Match, q: np.ndarray) -> bool:
    """Whether ``q`` re-renders the chain's last sampled ids exactly at the match point."""
    sampled = match.chain.sampled
    end = match.q_start + len(sampled)
    return end <= len(q) and np.array_equal(q[match.q_start : end], sampled)
