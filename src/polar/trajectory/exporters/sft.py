"""SFT conversations: chat messages (tool calls included) plus the exact token ids.

``messages``/``tools`` suit trainers that apply a chat template themselves; ``input_ids`` and
``assistant_masks`` (1 on sampled tokens) are the token-faithful form of the same conversation,
for trainers that take ids directly and must not re-tokenize.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.schemas.trajectory import Trace
from polar.trajectory.exporters.base import CREDIT_COLUMNS, Exporter, credit_fields, trace_from


class SFTExporter(Exporter):
    name = "sft"

    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "messages": trace.prompt_messages + trace.response_messages,
            "tools": trace.tools,
            "input_ids": trace.prompt_ids + trace.response_ids,
            "assistant_masks": [0] * len(trace.prompt_ids) + trace.loss_mask,
            "prompt_length": len(trace.prompt_ids),
            "num_prompt_messages": len(trace.prompt_messages),
            "finish_reason": trace.finish_reason,
            "reward": trace.reward,
            "metadata": trace.metadata,
            **credit_fields(trace),
            "session": dict(session),
        }

    def trace(self, row: Mapping[str, Any]) -> Trace:
        cut, split = row["prompt_length"], row["num_prompt_messages"]
        messages = row["messages"]
        extras = {
            "prompt_messages": messages[:split],
            "response_messages": messages[split:],
            "tools": row["tools"],
            "finish_reason": row["finish_reason"],
            "metadata": row["metadata"],
            **{name: row.get(name) for name in CREDIT_COLUMNS},
        }
        ids = row["input_ids"]
        return trace_from(
            ids[:cut], ids[cut:], row["assistant_masks"][cut:], None, row["reward"], extras
        )
