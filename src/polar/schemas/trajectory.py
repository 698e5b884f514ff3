"""Trace and Trajectory: the training data a session produces (public wire contract)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrajectoryStatus(StrEnum):
    COMPLETED = "COMPLETED"
    TIMEOUT = "TIMEOUT"
    ERROR = "ERROR"


class TraceKind(StrEnum):
    """Why a trace exists in its session's tree."""

    MAIN = "main"
    SUBAGENT = "subagent"
    COMPACTION = "compaction"
    RETRY = "retry"
    BRANCH = "branch"


class TraceLineage(BaseModel):
    """Where a trace sits in its session's tree (see docs/trajectories.md, "Session trees")."""

    model_config = ConfigDict(extra="forbid")

    kind: TraceKind
    parent_trace: int | None = Field(
        default=None,
        description="Index in the trajectory's traces of the trace holding parent_call.",
    )
    parent_call: str | None = Field(
        default=None, description="Completion id of the call this trace's first call branched from."
    )
    reason: str = Field(description="The evidence for ``kind`` (e.g. 'summary_marker').")


class MaskReason(StrEnum):
    """Why sampled tokens carry loss mask 0."""

    RETRY_ABANDONED = "retry_abandoned"
    STALE = "stale"
    ABORTED = "aborted"
    MULTIPLE_POLICY_VERSIONS = "multiple_policy_versions"


class ResponseSpan(BaseModel):
    """Response tokens ``[start, end)`` of a trace (one call's sampled ids)."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0)
    end: int = Field(ge=0)


class MaskSpan(ResponseSpan):
    """Sampled ids of one call masked out of the loss, and why."""

    reason: MaskReason
    completion_id: str | None = None


class TurnReward(ResponseSpan):
    """A per-turn score over one call's sampled ids."""

    reward: float
    source: str = Field(description="The turn-reward hook that scored it.")
    completion_id: str
    details: dict[str, Any] = Field(default_factory=dict)


class Trace(BaseModel):
    """One trainable sequence: a prompt, and a response with a loss mask over it."""

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int] = Field(description="0/1 per response token; 1 = sampled, trainable.")
    response_logprobs: list[float] | None = Field(
        default=None, description="Per response token; null when any trainable token lacks one."
    )
    prompt_messages: list[dict[str, Any]] = Field(default_factory=list)
    response_messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    reward: float | None = None
    lineage: TraceLineage | None = None
    masked: list[MaskSpan] = Field(
        default_factory=list, description="Sampled spans with loss mask 0, each with its reason."
    )
    turn_rewards: list[TurnReward] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _lengths_agree(self) -> Trace:
        n = len(self.response_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} response ids")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        if self.response_logprobs is not None and len(self.response_logprobs) != n:
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries for {n} response ids"
            )
        spans: list[ResponseSpan] = [*self.masked, *self.turn_rewards]
        for span in spans:
            if not span.start <= span.end <= n:
                raise ValueError(f"span [{span.start}, {span.end}) outside the {n} response ids")
        return self


class Trajectory(BaseModel):
    """All traces of one session, with how the session ended."""

    model_config = ConfigDict(extra="forbid")

    status: TrajectoryStatus
    traces: list[Trace] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
