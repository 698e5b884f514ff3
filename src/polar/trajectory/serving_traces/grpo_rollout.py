"""``grpo_rollout``: one row per sampled session (a GRPO sample), with its group, its prompt,
and per turn the sampled length, the observation the harness added and the time it took.

What a rollout simulator needs to replay the shape of GRPO rollouts: ``num_samples`` sessions
of a task form a group; each alternates a generation (``output_lengths``) and a tool or harness
step (``tool_times_ms``) that adds ``observation_lengths`` tokens to the next prompt. A turn is
measured from the call whose reply it follows: its parent in the session's agent tree.
docs/capture.md lists every field.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from polar.capture.records import CaptureRecord
from polar.trajectory.serving_traces.base import (
    CapturedSession,
    ServingTrace,
    ms,
    observation_length,
)


class GrpoRollout(ServingTrace):
    name = "grpo_rollout"

    def rows(self, sessions: Iterator[CapturedSession], origin: float) -> Iterator[dict[str, Any]]:
        for session in sessions:
            records = session.records
            pairs = list(zip(_followed(session), records[1:], strict=True))
            first = records[0]
            yield {
                "group_id": session.stored.task_id or session.session_id,
                "sample_index": session.stored.sample_index,
                "session_id": session.session_id,
                "num_turns": len(records),
                "prompt_length": len(first.prompt_ids),
                "output_lengths": [len(r.sampled_ids) for r in records],
                "observation_lengths": [observation_length(a, b) for a, b in pairs],
                "tool_times_ms": [ms(b.started_at - a.finished_at) for a, b in pairs],
                "generation_times_ms": [ms(r.finished_at - r.started_at) for r in records],
                "finish_reasons": [r.finish_reason for r in records],
            }


def _followed(session: CapturedSession) -> list[CaptureRecord]:
    """For each call after the first, the call whose reply it follows: its parent in the
    session's agent tree (a sub-agent's turns follow the sub-agent's, not the main agent's
    interleaved ones), else the call just before it (a side call)."""
    records = session.records
    by_id = {r.completion_id: r for r in records}
    out = []
    for before, record in itertools.pairwise(records):
        link = session.tree.links.get(record.completion_id)
        parent = by_id.get(link.parent) if link is not None and link.parent else None
        out.append(parent or before)
    return out
