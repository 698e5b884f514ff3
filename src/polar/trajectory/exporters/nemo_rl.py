"""NeMo RL message logs: per-message ``token_ids``, with ``generation_logprobs`` on model turns.

The prompt is one message holding all prompt ids; the response is split into runs: sampled
runs become ``assistant`` messages, the masked tokens between them ``environment`` messages
(tool results, user text, template glue). Traces made untrainable carry ``loss_multiplier`` 0
(their sampled runs are masked, so they appear as ``environment`` messages that keep their
``generation_logprobs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import Any

from polar.schemas.trajectory import Trace
from polar.trajectory.exporters.base import Exporter, trace_extras, trace_from

ASSISTANT = "assistant"
ENVIRONMENT = "environment"


class NemoRLExporter(Exporter):
    name = "nemo_rl"

    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        log: list[dict[str, Any]] = [
            {"role": "user", "content": self.text(trace.prompt_ids), "token_ids": trace.prompt_ids}
        ]
        at = 0
        for sampled, run in groupby(trace.loss_mask):
            n = len(list(run))
            ids = trace.response_ids[at : at + n]
            message: dict[str, Any] = {
                "role": ASSISTANT if sampled else ENVIRONMENT,
                "content": self.text(ids),
                "token_ids": ids,
            }
            logprobs = trace.response_logprobs[at : at + n] if trace.response_logprobs else None
            # masked runs keep logprobs only when they hold some (sampled turns of a trace
            # made untrainable), so the round trip stays exact
            if logprobs is not None and (sampled or any(logprobs)):
                message["generation_logprobs"] = logprobs
            log.append(message)
            at += n
        return {
            "message_log": log,
            "length": len(trace.prompt_ids) + len(trace.response_ids),
            "loss_multiplier": 1.0 if trace.stats.trainable else 0.0,
            "reward": trace.reward,
            "extra_env_info": {
                **trace_extras(trace),
                "has_logprobs": trace.response_logprobs is not None,
                "session": dict(session),
            },
        }

    def trace(self, row: Mapping[str, Any]) -> Trace:
        prompt, *rest = row["message_log"]
        response: list[int] = []
        mask: list[int] = []
        info = row["extra_env_info"]
        logprobs: list[float] | None = [] if info.get("has_logprobs", True) else None
        for message in rest:
            ids = list(message["token_ids"])
            sampled = message["role"] == ASSISTANT
            response += ids
            mask += [int(sampled)] * len(ids)
            if logprobs is None:
                continue
            if "generation_logprobs" in message:
                logprobs += list(message["generation_logprobs"])
            elif not sampled:
                logprobs += [0.0] * len(ids)
            else:
                logprobs = None
        return trace_from(prompt["token_ids"], response, mask, logprobs, row["reward"], info)
