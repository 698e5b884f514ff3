"""verl agent-loop outputs (``AgentLoopOutput`` fields) for its multi-turn rollout path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.schemas.trajectory import Trace
from polar.trajectory.exporters.base import Exporter, routing_of, trace_extras, trace_from


class VerlExporter(Exporter):
    name = "verl"

    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "prompt_ids": trace.prompt_ids,
            "response_ids": trace.response_ids,
            "response_mask": trace.loss_mask,
            "response_logprobs": trace.response_logprobs,
            # MoE routing replay (R3): (prompt + response - 1, layers, top_k) expert ids.
            "routed_experts": routing_of(trace),
            "reward_score": trace.reward,
            "num_turns": len(trace.prompt_messages) + len(trace.response_messages),
            "metrics": {},
            "extra_fields": {**trace_extras(trace), "session": dict(session)},
        }

    def trace(self, row: Mapping[str, Any]) -> Trace:
        return trace_from(
            row["prompt_ids"],
            row["response_ids"],
            row["response_mask"],
            row["response_logprobs"],
            row["reward_score"],
            row["extra_fields"],
        )
