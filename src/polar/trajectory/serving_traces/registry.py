"""Serving-trace formats by name (``agentic_replay``, ``grpo_rollout``) or ``module:Class``."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import orjson

from polar.registry import Registry
from polar.trajectory.serving_traces.agentic_replay import AgenticReplay
from polar.trajectory.serving_traces.base import ServingTrace, first_call_at, read_sessions
from polar.trajectory.serving_traces.grpo_rollout import GrpoRollout

serving_traces: Registry[ServingTrace] = Registry("serving trace")
serving_traces.add(AgenticReplay.name, AgenticReplay)
serving_traces.add(GrpoRollout.name, GrpoRollout)


def export_trace(
    store: str | Path,
    fmt: str,
    out: str | Path,
    *,
    block_size: int = 512,
    session_ids: Collection[str] | None = None,
) -> int:
    """Write the capture ``store``'s sessions as ``fmt`` JSONL to ``out``; returns the rows."""
    trace = serving_traces.create(fmt, block_size=block_size)
    origin = first_call_at(store, session_ids) if Path(store).is_file() else 0.0
    count = 0
    with Path(out).open("wb") as f:
        for row in trace.rows(read_sessions(store, session_ids), origin):
            f.write(orjson.dumps(row) + b"\n")
            count += 1
    return count
