"""The GRPO algorithm's knobs: advantage estimator, loss normalisation, clipping, failure policy.

One strict model shared by the embedded trainer and the bridges, so a choice made in a YAML file
means the same thing wherever the trajectories end up.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FailurePolicy = Literal["drop", "zero_advantage", "penalize"]
Normalisation = Literal["token", "trace", "session"]


class AdvantageConfig(BaseModel):
    """Group-relative advantages over the ``num_samples`` sessions of one task."""

    model_config = ConfigDict(extra="forbid")

    std_normalize: bool = Field(
        True, description="Divide by the group's reward std (GRPO); off gives Dr. GRPO."
    )
    leave_one_out: bool = Field(
        False, description="Baseline each session by the mean of the others (RLOO)."
    )
    eps: float = Field(1e-6, gt=0, description="Added to the std before dividing.")
    on_error: FailurePolicy = Field(
        "drop", description="ERROR sessions (and COMPLETED ones without a reward)."
    )
    on_timeout: FailurePolicy = Field("zero_advantage", description="TIMEOUT sessions.")
    failure_reward: float = Field(0.0, description="The reward a penalized session counts with.")
    turn_reward_weight: float = Field(
        0.0,
        ge=0,
        description="Weight of per-turn rewards in turn-level advantages (0: session-level "
        "only); see docs/training.md.",
    )
    drop_infra_failures: bool = Field(
        True,
        description="Leave sessions that failed for the infrastructure's sake (failure kind "
        "infra: node lost, runtime failed to start, cancelled) out of the baseline and the "
        "loss, whatever on_error says: they say nothing about the policy.",
    )


class LossConfig(BaseModel):
    """The token-level clipped policy-gradient loss."""

    model_config = ConfigDict(extra="forbid")

    normalisation: Normalisation = Field(
        "session",
        description="token: every trainable token weighs the same; trace: every trace; "
        "session: every session, however many traces it yielded.",
    )
    clip_low: float = Field(0.2, ge=0, description="Ratio floor is 1 - clip_low.")
    clip_high: float = Field(0.2, ge=0, description="Ratio ceiling is 1 + clip_high.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL penalty to a reference model.")


class AlgorithmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="When the trainer takes a session, mask (reason 'stale') every call "
        "sampled at a policy version older than the trainer's current one minus this "
        "(judged at consumption, whatever the builder masked); null: no call is stale.",
    )
