"""Splitting a new prompt part into the re-rendered previous turn and the interstitial.

When call k+1 extends call k's prompt, its new part holds the engine's re-rendering of the turn
call k sampled, then the harness's inserted messages and the generation-prompt glue. The merged
trace keeps the sampled ids (trainable) and the interstitial (masked); the re-rendering is
dropped. Where the re-rendering differs from the sampled ids, the trace's context differs from
what the engine saw next: that is template drift, and it is measured here rather than hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polar.errors import SplitError
from polar.trajectory.base import BREAK_NO_END_OF_TURN, BREAK_SPLIT_FAILURE
from polar.trajectory.lineage import common_prefix


@dataclass(frozen=True)
class TurnSplit:
    """How many tokens of the new part re-render the previous turn, and how many differ."""

    skip: int
    drift_tokens: int


def split_turn(sampled: np.ndarray, new_part: np.ndarray, eot: int | None) -> TurnSplit:
    """Locate the re-rendered turn at the head of ``new_part``.

    Exact re-rendering is the common case and needs no end-of-turn token: the sampled ids are
    skipped as they are (after a length stop the template's end-of-turn token then opens the
    interstitial, as it should). Otherwise the turn ends at the first end-of-turn token, which
    is skipped too when the sampled turn ended with one and kept (masked) when it did not.
    """
    n = len(sampled)
    if len(new_part) >= n and np.array_equal(new_part[:n], sampled):
        return TurnSplit(skip=n, drift_tokens=0)
    if eot is None:
        raise SplitError(BREAK_NO_END_OF_TURN)
    ends = np.flatnonzero(new_part == eot)
    if not len(ends):
        raise SplitError(BREAK_NO_END_OF_TURN)
    end = int(ends[0])
    ended = n > 0 and int(sampled[-1]) == eot
    body = sampled[:-1] if ended else sampled
    rerendered = new_part[:end]
    if len(body) and not len(rerendered):
        # The sampled turn is not in the next prompt at all (a template that drops tool-call
        # turns, say): merging would invent context the engine never saw.
        raise SplitError(BREAK_SPLIT_FAILURE)
    drift = max(len(body), len(rerendered)) - shared_edges(body, rerendered)
    return TurnSplit(skip=end + 1 if ended else end, drift_tokens=drift)


def shared_edges(a: np.ndarray, b: np.ndarray) -> int:
    """Tokens two sequences share at their start plus at their end (never counted twice)."""
    limit = min(len(a), len(b))
    if limit == 0:
        return 0
    head = common_prefix(a[:limit], b[:limit])
    if head == limit:
        return limit
    tail = common_prefix(a[::-1][: limit - head], b[::-1][: limit - head])
    return head + tail
