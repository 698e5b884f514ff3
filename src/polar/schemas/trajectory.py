"""Trace and Trajectory: the training data a session produces (public wire contract)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.schemas.harness_ids import HarnessIds
from polar.schemas.token_delivery import TokenDelivery


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


class CompactionStep(StrEnum):
    """Which part of a compaction a trace is: the call asking the model to summarise its
    history (a trace of its own where it does not extend that history's prompt, as Codex's,
    which drops the tools), or the rebuilt, shorter history carrying the summary."""

    SUMMARY = "summary"
    CONTINUATION = "continuation"


class CompactionEvidence(StrEnum):
    """What showed a call to be part of a compaction."""

    CODEX_SUMMARY_PROMPT = "codex_summary_prompt"  # Codex's "CONTEXT CHECKPOINT COMPACTION" ask
    CODEX_COMPACT_HEADER = "codex_compact_header"  # x-openai-subagent: compact
    SUMMARY_CARRIED = "summary_carried"  # a later compacted history carries its reply
    CODEX_SUMMARY_MESSAGE = "codex_summary_message"  # Codex's summary message closing it
    CLAUDE_CODE_CONTINUATION = "claude_code_continuation"  # "...continued from a previous..."
    CODEX_WINDOW = "codex_window"  # x-codex-window-id: the agent's context window went up


class CompactionLink(BaseModel):
    """A trace's part in a compaction, and the calls that tie it to the rest of the tree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: CompactionStep
    evidence: list[CompactionEvidence] = Field(min_length=1)
    summary_call: str | None = Field(
        default=None,
        description="A continuation's: the completion id of the call that sampled the summary "
        "it carries (None: no earlier call's reply is in it verbatim).",
    )


class LineageDisagreement(BaseModel):
    """One call placed one way by the CLI's own ids and another by prefix inference."""

    model_config = ConfigDict(extra="forbid")

    completion_id: str
    by_headers: str = Field(description="Its relation by the ids: 'continues', 'new_agent' ...")
    headers_parent_call: str | None = Field(description="Its parent call by the ids.")
    by_prefix: str = Field(description="Its relation by prefix inference.")
    prefix_parent_call: str | None = Field(description="Its parent call by prefix inference.")


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
    harness: HarnessIds | None = Field(
        default=None,
        description="The agent of the trace's first call as its CLI named it on the request "
        "headers (None: the CLI sent no lineage headers, the prompts alone decided).",
    )
    disagreements: list[LineageDisagreement] = Field(
        default_factory=list,
        description="Calls of this trace whose place by the CLI's ids differs from prefix "
        "inference (the ids decided).",
    )
    compaction: CompactionLink | None = Field(
        default=None,
        description="For a trace of kind compaction: whether it is the summary request or the "
        "compacted history, why, and the summary call.",
    )


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


class _WrittenFacts(BaseModel):
    """Facts a writer (a builder, the node, a trainer) states about a trace or trajectory.

    Strict where they are written: the model forbids unknown names, so a typo in a writer
    fails there. Tolerant where they are read (:meth:`read`): ``metadata`` is the wire
    contract's free-form slot, so results stored and rows exported by earlier versions, and
    traces a user built with keys of their own, are read with those keys left out. A field is
    in the written JSON exactly when the writer set it (:meth:`written`), as the dicts the
    builders wrote before: an unset fact stays absent, a fact set to null stays null."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> Self:
        """The facts in ``metadata``, with these defaults and no others; other keys ignored."""
        return cls.model_validate({k: v for k, v in metadata.items() if k in cls.model_fields})

    def written(self) -> dict[str, Any]:
        """The JSON metadata of these facts: every field set, in field order."""
        fields = self.model_dump(mode="json")
        return {name: value for name, value in fields.items() if name in self.model_fields_set}

    def merged(self, *others: Self) -> Self:
        """These facts with each of ``others``' set fields written over them, in turn."""
        data = self.written()
        for other in others:
            data.update(other.written())
        return self.model_validate(data)


class TraceStats(_WrittenFacts):
    """What a builder records about one trace, read as types: the calls it holds and how they
    were merged. Builders construct it and write it into ``Trace.metadata`` (so exported rows
    keep their JSON); every reader takes it from ``Trace.stats``, with these defaults."""

    completion_ids: list[str] = Field(default_factory=list)
    num_calls: int = 1
    merged_calls: int = 0
    context_exact_calls: int = 0
    inexact_context_calls: list[str] = Field(
        default_factory=list,
        description="Merged calls whose context in the trace is not their engine prompt.",
    )
    chain_index: int = 0
    segment_index: int = 0
    break_reason: str | None = None
    forked_from: str | None = None
    side_call: str | None = None
    drift_turns: int = 0
    drift_tokens: int = 0
    repaired_steps: int = 0
    repaired_tokens: int = 0
    policy_versions: list[int] = Field(default_factory=list)
    aborted: bool = False
    trainable: bool = True
    untrainable_reasons: list[str] = Field(
        default_factory=list, description="Why the mask was zeroed: aborted, multiple versions."
    )
    sampled_tokens: int = 0
    flags: list[str] = Field(default_factory=list, description="The calls' capture flags.")
    call_spans: list[tuple[int, int]] = Field(
        default_factory=list, description="Each call's sampled ids [start, end) in the response."
    )
    call_versions: list[int | None] = Field(
        default_factory=list, description="Each call's policy version (None: not recorded)."
    )
    routed_experts: str | None = Field(
        None, description="Base64 .npy of the trace's MoE routing (R3), when every call had it."
    )
    behaviour_logprobs: Literal["recomputed"] | None = Field(
        None,
        description="The embedded trainer's mark on a trace whose rollout lacked logprobs: "
        "response_logprobs are the pre-update model's, recomputed.",
    )


class TrajectoryStats(_WrittenFacts):
    """What a builder and the node record about a whole session's trajectory, read as types
    (the keys of ``Trajectory.metadata``; readers use ``Trajectory.stats``)."""

    builder: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    group_id: str | int | None = None  # lifted from the task's metadata as given
    policy_version: int | None = None
    rollout_step: int | str | None = None  # lifted from the task's metadata as given
    sample_index: int | None = None
    node_id: str | None = None
    harness: str | None = None
    eot_token_id: int | None = None
    eot_source: Literal["config", "learned"] | None = None
    template_repair: list[str] = Field(default_factory=list)
    num_traces: int = 0
    num_chains: int = 0
    breaks: dict[str, int] = Field(default_factory=dict)
    drift_turns: int = 0
    drift_tokens: int = 0
    repaired_steps: int = 0
    repaired_tokens: int = 0
    side_call_traces: int = 0
    completions_per_trace: float = 0.0
    merged_calls: int = 0
    context_exact_calls: int = 0
    untrainable_traces: int = 0
    masked_tokens: dict[str, int] = Field(default_factory=dict)
    trace_kinds: dict[str, int] = Field(default_factory=dict)
    num_calls: int = 0
    calls_in_traces: int = 0
    excluded_side_calls: list[str] = Field(default_factory=list)
    delivery: TokenDelivery | None = Field(
        None,
        description="The session's sampled tokens, delivered to trainable traces or lost by "
        "reason, as the builder counted them (before the session's outcome; None: not counted).",
    )
    turn_rewards: int = Field(0, description="Per-turn rewards attached to the traces.")


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
        return TraceStats.read(self.metadata)

    def with_stats(self, stats: TraceStats) -> Trace:
        """A copy whose ``metadata`` states the fields ``stats`` sets over what it held (its
        other keys stay as they were)."""
        return self.model_copy(update={"metadata": {**self.metadata, **stats.written()}})

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
        return TrajectoryStats.read(self.metadata)

    def with_stats(self, stats: TrajectoryStats) -> Trajectory:
        """A copy whose ``metadata`` states the fields ``stats`` sets over what it held (its
        other keys stay as they were)."""
        return self.model_copy(update={"metadata": {**self.metadata, **stats.written()}})
