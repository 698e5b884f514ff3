"""TRL bridge: a ``rollout_func`` for ``GRPOTrainer`` whose rollouts run through Polar.

TRL hands the function its prompts already repeated ``num_generations`` times, in runs. Each run
becomes one Polar task with ``num_samples = num_generations``; every session becomes one row,
converted by the TRL exporter from its main (prefix-merged) trace: ``prompt_ids``,
``completion_ids`` (sampled turns and the tool/user tokens between them), ``logprobs`` (the
engine's) and ``env_mask`` (1 on sampled tokens only). The session's reward travels as the
``reward`` column, which :func:`polar_reward` hands back to TRL as a reward function.

A failed session cannot be dropped (TRL needs one row per prompt slot): with ``zero_advantage``
its row has no reward, which TRL treats as unscorable (left out of the group's mean and std,
advantage 0), and an all-zero ``env_mask``; with ``penalize`` it keeps its tokens and scores
``failure_reward``. With ``drop_infra_failures`` (the default) a session the infrastructure
failed (failure kind ``infra``) is always unscorable, never penalized.

When TRL trains the very model the engine serves (the embedded engine in the same process),
pass ``on_new_weights`` (e.g. ``lambda step: core.bump_policy_version()``): it runs before a
rollout whenever TRL's global step moved, so the engine drops key/value caches of the old weights
and stamps the new version. With a vLLM server, TRL's own weight sync applies and the gateway's
policy version can be set with :class:`~polar.training.gateway_control.GatewayControl`.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from polar.client import RolloutClient
from polar.schemas.task import TaskRequest
from polar.schemas.trajectory import Trace
from polar.training.bridges.sessions import (
    BridgeFailurePolicy,
    SessionSampleRow,
    session_rows,
    untrainable,
)
from polar.trajectory.exporters.trl import TRLExporter

TaskFactory = Callable[[Any, int], TaskRequest]


class PolarRolloutFunc:
    """``GRPOTrainer(rollout_func=PolarRolloutFunc(url, make_task))``.

    ``make_task(prompt, index)`` builds the TaskRequest for one prompt (its id and
    ``num_samples`` are set here); :func:`task_from_template` covers the usual case.
    """

    def __init__(
        self,
        rollout_url: str,
        make_task: TaskFactory,
        *,
        token: str | None = None,
        timeout_s: float = 3600.0,
        on_failure: BridgeFailurePolicy = "zero_advantage",
        failure_reward: float = 0.0,
        drop_infra_failures: bool = True,
        on_new_weights: Callable[[int], object] | None = None,
        client: RolloutClient | None = None,
    ) -> None:
        self.client = client or RolloutClient(rollout_url, token=token)
        self.make_task = make_task
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self.failure_reward = failure_reward
        self.drop_infra_failures = drop_infra_failures
        self.on_new_weights = on_new_weights
        self.exporter = TRLExporter()
        self.run_id = uuid.uuid4().hex[:8]
        self._counter = itertools.count()
        self._last_step: int | None = None
        self.last_rows: list[SessionSampleRow] = []

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0))
        if self.on_new_weights is not None and step != self._last_step:
            if self._last_step is not None:
                self.on_new_weights(step)
            self._last_step = step
        training = bool(getattr(getattr(trainer, "model", None), "training", True))
        n = int(trainer.num_generations if training else trainer.num_generations_eval)
        groups = group_prompts(prompts, n)
        tasks: list[TaskRequest] = []
        for prompt in groups:
            task = self.make_task(prompt, next(self._counter))
            task_id = f"trl-{self.run_id}-{step}-{len(tasks)}-{task.task_id}"
            metadata = {**task.metadata, "group_id": task_id, "rollout_step": step}
            tasks.append(
                task.model_copy(update={"task_id": task_id, "num_samples": n, "metadata": metadata})
            )
        results = self.client.run(tasks, self.timeout_s)
        rows = [
            row
            for result in results
            for row in session_rows(
                result,
                expected=n,
                on_failure=self.on_failure,
                failure_reward=self.failure_reward,
                drop_infra_failures=self.drop_infra_failures,
            )
        ]
        self.last_rows = rows
        return self.output(rows, trainer)

    def output(self, rows: Sequence[SessionSampleRow], trainer: Any) -> dict[str, list[Any]]:
        """The column dict TRL reads (one entry per row), via the TRL exporter."""
        columns: dict[str, list[Any]] = {}
        for row in rows:
            trace = row.trace if row.trace is not None else placeholder_trace(trainer)
            if not row.trainable:
                trace = untrainable(trace)
            out = self.exporter.row(trace, row.session)
            if out["logprobs"] is None:  # TRL reads None entries as "no logprob" (NaN)
                out["logprobs"] = [None] * len(out["completion_ids"])
            out["reward"] = row.reward
            out["polar_left_out_traces"] = row.left_out_traces
            for key, value in out.items():
                columns.setdefault(key, []).append(value)
        return columns


def group_prompts(prompts: Sequence[Any], n: int) -> list[Any]:
    """The distinct prompt of each run of ``n`` (TRL repeats every prompt ``n`` times)."""
    if n < 1 or len(prompts) % n:
        raise ValueError(f"{len(prompts)} prompts do not split into groups of {n}")
    groups = []
    for start in range(0, len(prompts), n):
        run = prompts[start : start + n]
        if any(p != run[0] for p in run):
            raise ValueError(
                f"prompts {start}..{start + n - 1} differ: TRL should repeat each prompt "
                f"num_generations ({n}) times in a row"
            )
        groups.append(run[0])
    return groups


def task_from_template(template: TaskRequest) -> TaskFactory:
    """A factory that puts the prompt's text (the last user message) into ``template``."""

    def make(prompt: Any, index: int) -> TaskRequest:
        return template.model_copy(
            update={"task_id": f"{template.task_id}-{index}", "instruction": prompt_text(prompt)}
        )

    return make


def prompt_text(prompt: Any) -> str:
    """A string prompt as is; a conversational one's last user message."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt)):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))
    raise ValueError("the prompt has no user message")


def placeholder_trace(trainer: Any) -> Trace:
    """For a session that produced no trace at all: one end-of-sequence token, masked out."""
    tokenizer = trainer.processing_class
    eos = int(tokenizer.eos_token_id)
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    return Trace(prompt_ids=[int(bos)], response_ids=[eos], loss_mask=[0], response_logprobs=[0.0])


def polar_reward(
    prompts: Sequence[Any], completions: Sequence[Any], reward: Sequence[float | None], **_: Any
) -> list[float | None]:
    """TRL reward function: the reward Polar's evaluator gave each session (None: unscorable)."""
    return list(reward)
