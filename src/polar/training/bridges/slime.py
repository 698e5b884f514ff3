"""slime bridge: a rollout function whose samples come from Polar sessions.

slime calls ``generate_rollout(args, rollout_id, data_source, evaluation=False)`` (set with
``--rollout-function-path polar.training.bridges.slime.generate_rollout``). The data source
hands out groups of ``n_samples_per_prompt`` Samples sharing a prompt; each group becomes one
Polar task with that many sessions, and each session fills one Sample: ``tokens`` (prompt +
response), ``response_length``, ``loss_mask`` and ``rollout_log_probs`` over the response,
``reward``, ``status``, plus Polar's session facts under ``metadata["polar"]``. The token
conversion is the slime exporter's; this module only adds grouping, statuses and failure policy.

Statuses: a completed session is ``completed`` (``truncated`` when its last turn hit the length
limit), a timed-out one ``truncated``, an errored one ``failed``. A failed session cannot leave
its group (slime reshapes rewards by ``n_samples_per_prompt``), so with ``zero_advantage`` it
keeps its slot with an all-zero loss mask, ``remove_sample`` set and the group's mean reward,
which leaves the group's baseline unchanged and gives it advantage 0. With
``drop_infra_failures`` (the default) a session the infrastructure failed (failure kind
``infra``) is treated so even under ``penalize``: it says nothing about the policy.

Weight updates: generation is open only while a rollout is collected. The function resumes
the gateways (stamping ``rollout_id`` as the policy version) when it starts and pauses them
when it returns, so slime's weight sync that follows runs against idle engines.

Configuration comes from the environment (slime passes only its own ``args``):
``POLAR_ROLLOUT_URL``, ``POLAR_ROLLOUT_TOKEN``, ``POLAR_TASK_FACTORY`` (``module:function``
taking a Sample and returning a TaskRequest), ``POLAR_GATEWAY_URLS`` (comma separated; default:
the nodes the rollout server knows), ``POLAR_GATEWAY_TOKEN``, ``POLAR_ON_FAILURE``,
``POLAR_DROP_INFRA_FAILURES`` (``1``, the default, or ``0``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from polar.client import RolloutClient
from polar.errors import ConfigError
from polar.registry import Registry
from polar.schemas.task import SessionStatus, TaskRequest
from polar.training.bridges.sessions import (
    BridgeFailurePolicy,
    SessionSampleRow,
    session_rows,
    untrainable,
)
from polar.training.gateway_control import GatewayControl
from polar.trajectory.exporters.slime import SlimeExporter

SampleFactory = Callable[[Any], TaskRequest]
SAMPLE_FIELDS = (
    "tokens",
    "response",
    "response_length",
    "loss_mask",
    "rollout_log_probs",
    "reward",
    "status",
)


def sample_fields(
    row: SessionSampleRow, neutral_reward: float, exporter: SlimeExporter | None = None
) -> dict[str, Any]:
    """The Sample fields one session fills (``status`` as slime's Status value string)."""
    exporter = exporter or SlimeExporter()
    if row.trace is None:
        return {
            "tokens": [],
            "response": "",
            "response_length": 0,
            "loss_mask": [],
            "rollout_log_probs": [],
            "reward": neutral_reward,
            "status": "failed",
            "remove_sample": True,
            "metadata": {"polar": {**row.session, "left_out_traces": 0}},
        }
    trace = row.trace if row.trainable else untrainable(row.trace)
    out = exporter.row(trace, row.session)
    status = out["status"]
    if row.result.status == SessionStatus.TIMEOUT:
        status = "truncated"
    elif row.result.status == SessionStatus.ERROR:
        status = "failed"
    versions = trace.stats.policy_versions
    routing = out["rollout_routed_experts"]
    return {
        **{k: out[k] for k in SAMPLE_FIELDS},
        # slime replays a MoE's routing from this array (R3): (tokens - 1, layers, top_k).
        **({"rollout_routed_experts": np.asarray(routing)} if routing is not None else {}),
        "reward": row.reward if row.reward is not None else neutral_reward,
        "status": status,
        "remove_sample": not row.trainable,
        "weight_versions": [str(v) for v in versions],
        "metadata": {
            "polar": {
                **out["metadata"]["session"],
                "left_out_traces": row.left_out_traces,
                "trace": {k: v for k, v in out["metadata"].items() if k != "session"},
            }
        },
    }


def group_fields(rows: Sequence[SessionSampleRow]) -> list[dict[str, Any]]:
    """Fields for a whole group; failed rows get the mean reward of the scored ones."""
    scored = [r.reward for r in rows if r.reward is not None]
    neutral = statistics.fmean(scored) if scored else 0.0
    exporter = SlimeExporter()
    return [sample_fields(row, neutral, exporter) for row in rows]


def fill_sample(sample: Any, fields: dict[str, Any]) -> Any:
    """Write ``fields`` into a slime Sample (or a dict); status becomes ``Sample.Status``."""
    if isinstance(sample, dict):
        metadata = {**(sample.get("metadata") or {}), **fields["metadata"]}
        sample.update({**fields, "metadata": metadata})
        return sample
    for key, value in fields.items():
        if key == "metadata":
            sample.metadata = {**(getattr(sample, "metadata", None) or {}), **value}
        elif key == "status" and hasattr(type(sample), "Status"):
            sample.status = type(sample).Status(value)
        else:
            setattr(sample, key, value)
    return sample


class PolarSlimeRollout:
    """The rollout function's state: clients and the task factory, built once per process."""

    def __init__(
        self,
        rollout_url: str,
        make_task: SampleFactory,
        *,
        token: str | None = None,
        gateway_urls: Sequence[str] | None = None,
        gateway_token: str | None = None,
        on_failure: BridgeFailurePolicy = "zero_advantage",
        drop_infra_failures: bool = True,
        timeout_s: float = 3600.0,
    ) -> None:
        self.client = RolloutClient(rollout_url, token=token)
        self.make_task = make_task
        self.gateway_urls = list(gateway_urls) if gateway_urls else None
        self.gateway_token = gateway_token
        self.on_failure = on_failure
        self.drop_infra_failures = drop_infra_failures
        self.timeout_s = timeout_s

    @classmethod
    def from_env(cls) -> PolarSlimeRollout:
        url = os.environ.get("POLAR_ROLLOUT_URL")
        factory = os.environ.get("POLAR_TASK_FACTORY")
        if not url or not factory:
            raise ConfigError("set POLAR_ROLLOUT_URL and POLAR_TASK_FACTORY for the slime bridge")
        urls = [u for u in os.environ.get("POLAR_GATEWAY_URLS", "").split(",") if u]
        policy = os.environ.get("POLAR_ON_FAILURE", "zero_advantage")
        if policy not in ("zero_advantage", "penalize"):
            raise ConfigError(f"POLAR_ON_FAILURE must be zero_advantage or penalize, not {policy}")
        drop_infra = os.environ.get("POLAR_DROP_INFRA_FAILURES", "1")
        if drop_infra not in ("0", "1"):
            raise ConfigError(f"POLAR_DROP_INFRA_FAILURES must be 1 or 0, not {drop_infra!r}")
        return cls(
            url,
            Registry[TaskRequest]("task factory").get(factory),
            token=os.environ.get("POLAR_ROLLOUT_TOKEN"),
            gateway_urls=urls or None,
            gateway_token=os.environ.get("POLAR_GATEWAY_TOKEN"),
            on_failure=policy,  # type: ignore[arg-type]
            drop_infra_failures=drop_infra == "1",
        )

    def rollout(self, groups: Sequence[Sequence[Any]], rollout_id: int) -> list[list[Any]]:
        """Run one task per group (generation open only meanwhile) and fill its Samples."""
        control = GatewayControl(
            self.gateway_urls or self.client.node_urls(), token=self.gateway_token
        )
        try:
            control.set_policy(rollout_id)
            control.resume()
            tasks = [self._task(group, rollout_id, i) for i, group in enumerate(groups)]
            results = self.client.run(tasks, self.timeout_s)
        finally:
            control.pause()
            control.close()
        filled = []
        for group, result in zip(groups, results, strict=True):
            rows = session_rows(
                result,
                expected=len(group),
                on_failure=self.on_failure,
                drop_infra_failures=self.drop_infra_failures,
            )
            filled.append(
                [
                    fill_sample(sample, fields)
                    for sample, fields in zip(group, group_fields(rows), strict=True)
                ]
            )
        return filled

    def _task(self, group: Sequence[Any], rollout_id: int, index: int) -> TaskRequest:
        task = self.make_task(group[0])
        task_id = f"slime-{rollout_id}-{index}-{task.task_id}"
        metadata = {
            **task.metadata,
            "group_id": task_id,
            "rollout_step": rollout_id,
            "policy_version": rollout_id,
        }
        return task.model_copy(
            update={"task_id": task_id, "num_samples": len(group), "metadata": metadata}
        )


_bridge: PolarSlimeRollout | None = None


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function entry point (configured from the environment)."""
    global _bridge
    if _bridge is None:
        _bridge = PolarSlimeRollout.from_env()
    groups = data_source.get_samples(args.rollout_batch_size)
    filled = _bridge.rollout(groups, rollout_id)
    if evaluation:
        flat = [s for group in filled for s in group]
        return {
            "polar": {
                "rewards": [_get(s, "reward") for s in flat],
                "truncated": [_get(s, "status") == "truncated" for s in flat],
                "samples": flat,
            }
        }
    return filled


def _get(sample: Any, key: str) -> Any:
    value = sample.get(key) if isinstance(sample, dict) else getattr(sample, key)
    return getattr(value, "value", value)
