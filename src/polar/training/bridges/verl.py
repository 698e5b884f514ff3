"""verl bridge: an agent loop whose outputs come from a Polar session.

verl's agent-loop rollout calls ``run(sampling_params, **kwargs)`` once per sample (it repeats
each prompt ``rollout.n`` times and groups them itself for GRPO). The Polar agent loop submits
one task with one session for it, waits, and returns the session's main trace as an
``AgentLoopOutput`` via the verl exporter: ``prompt_ids``, ``response_ids``, ``response_mask``
(1 on sampled tokens), ``response_logprobs``, ``reward_score`` (the evaluator's; verl uses it
instead of running its own reward function), ``num_turns``, and Polar's session facts under
``extra_fields["polar"]``.

verl pads responses to ``rollout.response_length``: a longer response is cut there (mask and
logprobs with it) and flagged ``extra_fields["polar"]["truncated"]``; a prompt longer than
``rollout.prompt_length`` is an error (raise the limit; cutting a prompt would train on a
context the model never saw). A failed session (``zero_advantage``) keeps its tokens with an
all-zero mask and reward 0, so it teaches nothing; verl's group baseline still counts that 0.

verl groups the samples itself after the loop returns, so a sample cannot leave its group.
With ``drop_infra_failures`` (the default) a session the infrastructure failed (failure kind
``infra``: node lost, runtime failed to start, cancelled) is run again as a fresh task, up to
``infra_retries`` times, so its slot holds a real sample rather than a 0 that says nothing about
the policy; if every try fails that way the failed row stands, and
``extra_fields["polar"]["failure_kind"]`` says so.

Wire it up with :func:`register_agent_loop` (needs verl) in the module verl imports for agent
loops, and point the Polar gateway nodes' engine at verl's rollout servers.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

from polar.client import RolloutClient
from polar.schemas.task import TaskRequest
from polar.training.bridges.sessions import BridgeFailurePolicy, session_rows, untrainable
from polar.trajectory.exporters.verl import VerlExporter

LoopTaskFactory = Callable[[dict[str, Any]], TaskRequest]


class PolarAgentLoop:
    """The bridge's logic, free of verl: ``await loop.run(sampling_params, **kwargs)``."""

    def __init__(
        self,
        rollout_url: str,
        make_task: LoopTaskFactory,
        *,
        token: str | None = None,
        prompt_length: int | None = None,
        response_length: int | None = None,
        timeout_s: float = 3600.0,
        on_failure: BridgeFailurePolicy = "zero_advantage",
        drop_infra_failures: bool = True,
        infra_retries: int = 2,
        client: RolloutClient | None = None,
    ) -> None:
        self.client = client or RolloutClient(rollout_url, token=token)
        self.make_task = make_task
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self.drop_infra_failures = drop_infra_failures
        self.infra_retries = max(0, infra_retries)
        self.exporter = VerlExporter()
        self.run_id = uuid.uuid4().hex[:8]
        self._counter = itertools.count()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """AgentLoopOutput fields for one sample; ``kwargs`` are the dataset row verl passes
        (``raw_prompt``, ``extra_info``, ...), handed to ``make_task``."""
        started = time.perf_counter()
        made = self.make_task(kwargs)
        allowed = self.infra_retries if self.drop_infra_failures else 0
        retries = 0
        while True:
            task_id = f"verl-{self.run_id}-{next(self._counter)}-{made.task_id}"
            task = made.model_copy(
                update={
                    "task_id": task_id,
                    "num_samples": 1,
                    "metadata": {**made.metadata, "group_id": task_id},
                }
            )
            [result] = await asyncio.to_thread(self.client.run, [task], self.timeout_s)
            [row] = session_rows(
                result,
                expected=1,
                on_failure=self.on_failure,
                drop_infra_failures=self.drop_infra_failures,
            )
            if not (row.failed and row.infra_failure) or retries >= allowed:
                break
            retries += 1
        if row.trace is None:
            raise RuntimeError(
                f"Polar session {row.result.session_id} produced no trace "
                f"({row.result.status.value}: {row.result.error}); verl needs tokens for every "
                "sample"
            )
        trace = row.trace if row.trainable else untrainable(row.trace)
        out = self.exporter.row(trace, row.session)
        if self.prompt_length is not None and len(out["prompt_ids"]) > self.prompt_length:
            raise ValueError(
                f"prompt of {len(out['prompt_ids'])} tokens exceeds rollout.prompt_length "
                f"{self.prompt_length}; raise it"
            )
        truncated = False
        limit = self.response_length
        if limit is not None and len(out["response_ids"]) > limit:
            truncated = True
            for key in ("response_ids", "response_mask", "response_logprobs"):
                if out[key] is not None:
                    out[key] = out[key][:limit]
            if out["routed_experts"] is not None:  # one position per token but the last
                out["routed_experts"] = out["routed_experts"][: len(out["prompt_ids"]) + limit - 1]
        polar = out.pop("extra_fields")
        polar.update(
            left_out_traces=row.left_out_traces, truncated=truncated, infra_retries=retries
        )
        if row.result.failure is not None:
            polar["failure_kind"] = row.result.failure.kind
        out["reward_score"] = row.reward if row.reward is not None else 0.0
        out["extra_fields"] = {"polar": polar}
        out["metrics"] = {
            "generate_sequences": time.perf_counter() - started,
            "tool_calls": 0.0,
        }
        return out


def register_agent_loop(name: str, make_loop: Callable[[], PolarAgentLoop]) -> type:
    """Define and register a verl ``AgentLoopBase`` subclass named ``name`` that delegates to
    the loop ``make_loop()`` builds (once per worker process). Requires verl."""
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopOutput,
        register,
    )

    shared: dict[str, PolarAgentLoop] = {}

    class PolarVerlAgentLoop(AgentLoopBase):
        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            loop = shared.get("loop")
            if loop is None:
                loop = shared["loop"] = make_loop()
            return AgentLoopOutput(**await loop.run(sampling_params, **kwargs))

    register(name)(PolarVerlAgentLoop)
    return PolarVerlAgentLoop
