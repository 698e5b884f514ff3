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


class TraceStats(BaseModel):
    """What a builder records about one trace, read as types: the calls it holds and how they
    were merged. Builders write these keys into ``Trace.metadata`` (so exported rows keep their
    JSON); every reader takes them from ``Trace.stats``, with these defaults and no others."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    completion_ids: list[str] = Field(default_factory=list)
    call_spans: list[tuple[int, int]] = Field(
        default_factory=list, description="Each call's sampled ids [start, end) in the response."
    )
    call_versions: list[int | None] = Field(
        default_factory=list, description="Each call's policy version (None: not recorded)."
    )
    policy_versions: list[int] = Field(default_factory=list)
    num_calls: int = 1
    merged_calls: int = 0
    context_exact_calls: int = 0
    break_reason: str | None = None
    side_call: str | None = None
    aborted: bool = False
    trainable: bool = True
    routed_experts: str | None = Field(
        None, description="Base64 .npy of the trace's MoE routing (R3), when every call had it."
    )


class TrajectoryStats(BaseModel):
    """What a builder and the node record about a whole session's trajectory, read as types
    (the keys of ``Trajectory.metadata``; readers use ``Trajectory.stats``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    session_id: str | None = None
    task_id: str | None = None
    group_id: str | int | None = None  # lifted from the task's metadata as given
    policy_version: int | None = None
    rollout_step: int | str | None = None  # lifted from the task's metadata as given
    num_calls: int = 0
    num_traces: int = 0
    calls_in_traces: int = 0
    merged_calls: int = 0
    context_exact_calls: int = 0
    drift_turns: int = 0
    drift_tokens: int = 0
    breaks: dict[str, int] = Field(default_factory=dict)


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

    @property
    def stats(self) -> TraceStats:
        """The builder's facts about this trace (from ``metadata``), typed."""
        return TraceStats.model_validate(self.metadata)

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

    @property
    def stats(self) -> TrajectoryStats:
        """The builder's and the node's facts about this session (from ``metadata``), typed."""
        return TrajectoryStats.model_validate(self.metadata)
