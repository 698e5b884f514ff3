"""slime ``Sample`` dicts: ``tokens`` is prompt + response; mask and logprobs cover the response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.schemas.trajectory import Trace
from polar.trajectory.exporters.base import Exporter, routing_of, trace_extras, trace_from


class SlimeExporter(Exporter):
    name = "slime"

    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "prompt": trace.prompt_messages,
            "tokens": trace.prompt_ids + trace.response_ids,
            "response": self.text(trace.response_ids),
            "response_length": len(trace.response_ids),
            "loss_mask": trace.loss_mask,
            "rollout_log_probs": trace.response_logprobs,
            # MoE routing replay (R3): (prompt + response - 1, layers, top_k) expert ids.
            "rollout_routed_experts": routing_of(trace),
            "reward": trace.reward,
            "status": _status(trace),
            "metadata": {**trace_extras(trace), "session": dict(session)},
        }

    def trace(self, row: Mapping[str, Any]) -> Trace:
        tokens, n = row["tokens"], row["response_length"]
        cut = len(tokens) - n
        return trace_from(
            tokens[:cut],
            tokens[cut:],
            row["loss_mask"],
            row["rollout_log_probs"],
            row["reward"],
            row["metadata"],
        )


def _status(trace: Trace) -> str:
    """slime's Sample.Status values: aborted, truncated (length stop) or completed."""
    if trace.stats.aborted:
        return "aborted"
    if trace.finish_reason == "length":
        return "truncated"
    return "completed"
