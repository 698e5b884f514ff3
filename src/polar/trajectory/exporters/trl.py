"""TRL ``GRPOTrainer`` ``rollout_func`` outputs.

A rollout function returns one dict of columns: ``prompt_ids``, ``completion_ids``,
``logprobs`` and ``env_mask`` (1 on model-sampled tokens, 0 on tool and user tokens); any other
key is passed through to the reward functions, which is where the trace's extras travel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from polar.schemas.trajectory import Trace, Trajectory
from polar.trajectory.exporters.base import Exporter, trace_extras, trace_from


class TRLExporter(Exporter):
    name = "trl"

    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "prompt_ids": trace.prompt_ids,
            "completion_ids": trace.response_ids,
            "logprobs": trace.response_logprobs,
            "env_mask": trace.loss_mask,
            "reward": trace.reward,
            "polar": {**trace_extras(trace), "session": dict(session)},
        }

    def trace(self, row: Mapping[str, Any]) -> Trace:
        return trace_from(
            row["prompt_ids"],
            row["completion_ids"],
            row["env_mask"],
            row["logprobs"],
            row["reward"],
            row["polar"],
        )

    def rollout_output(self, trajectories: Iterable[Trajectory]) -> dict[str, list[Any]]:
        """The column dict a ``rollout_func`` returns, one entry per trace."""
        columns: dict[str, list[Any]] = {}
        for row in self.rows(trajectories):
            for key, value in row.items():
                columns.setdefault(key, []).append(value)
        return columns

    def traces_from_output(self, output: Mapping[str, list[Any]]) -> list[Trace]:
        """The inverse of :meth:`rollout_output`."""
        n = len(output.get("prompt_ids", []))
        return [self.trace({k: v[i] for k, v in output.items()}) for i in range(n)]
