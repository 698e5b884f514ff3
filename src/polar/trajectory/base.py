"""The builder interface: captured calls in, a Trajectory of trainer-ready traces out.

A builder only decides how calls group into segments (one segment = one trace). Everything
else is shared here so every builder treats side calls, aborted generations, policy versions,
missing logprobs and bookkeeping the same way, and no captured call goes unaccounted for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from polar.capture import routed_experts
from polar.capture.records import CaptureRecord
from polar.errors import ConfigError
from polar.schemas.flags import FLAG_ABORTED
from polar.schemas.token_delivery import MASK_REASONS, LossReason, LostTokens, TokenDelivery
from polar.schemas.trajectory import (
    MaskReason,
    MaskSpan,
    Trace,
    TraceLineage,
    TraceStats,
    Trajectory,
    TrajectoryStats,
    TrajectoryStatus,
)
from polar.trajectory.lineage import SessionTree, learn_eot, session_tree
from polar.trajectory.template_repair import RULES

SIDE_CALL_TAG = "side_call:"
ABORT_FINISH_REASON = "abort"

# Why a chain continues in a new segment (keys of the trajectory's ``breaks`` counter).
BREAK_PREFIX = "prefix_break"
BREAK_NO_END_OF_TURN = "no_end_of_turn"
BREAK_SPLIT_FAILURE = "split_failure"
BREAK_RETRY = "retry"
BREAK_PROMPT_IDS_MISSING = "prompt_ids_missing"
BREAK_CONTEXT_DRIFT = "context_drift"


class BuilderConfig(BaseModel):
    """Options shared by the builders (``builder.config`` of a TaskRequest)."""

    model_config = ConfigDict(extra="forbid")

    context: Literal["exact", "tolerant"] = Field(
        default="exact",
        description="exact: every merged call's context in a trace equals the prompt the "
        "engine saw (a call that cannot meet it starts a new trace, reason context_drift); "
        "tolerant: merge across template drift and repairs, so later calls' contexts may "
        "differ from what the engine conditioned on (off-policy; see docs/trajectories.md).",
    )

    eot_token_id: int | None = Field(
        default=None,
        description="End-of-turn token; learned from the first naturally stopped call if unset.",
    )
    template_repair: list[str] = Field(
        default_factory=list,
        description="Opt-in template-glue repair rules (see docs/trajectories.md).",
    )
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer source the repair rules read their token ids from "
        "(HF directory or GGUF file); the default SmolLM2 tokenizer when unset.",
    )
    side_calls: Literal["exclude", "separate"] = Field(
        default="exclude",
        description="Calls tagged 'side_call:*' (titles, memory, routing): left out, or one "
        "trace each.",
    )
    aborted_trainable: bool = Field(
        default=False, description="Whether traces holding an aborted generation keep their mask."
    )
    multi_version_trainable: bool = Field(
        default=True,
        description="Whether traces whose calls span several policy versions keep their mask.",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="Mask (reason 'stale') the sampled ids of calls whose policy version is "
        "older than the current version minus this; unset: no call is stale.",
    )

    @field_validator("template_repair")
    @classmethod
    def _known_rules(cls, rules: list[str]) -> list[str]:
        unknown = [r for r in rules if r not in RULES]
        if unknown:
            raise ValueError(
                f"unknown template_repair rule(s) {unknown} (known: {', '.join(RULES)})"
            )
        return rules

    @model_validator(mode="after")
    def _repair_needs_tolerance(self) -> BuilderConfig:
        if self.template_repair and self.context == "exact":
            raise ValueError(
                "template_repair merges calls whose contexts differ from the engine's prompts; "
                "it needs context: tolerant"
            )
        return self


@dataclass
class Segment:
    """Calls merged into one trace; ``interstitials[i]`` precedes call i's sampled ids."""

    records: list[CaptureRecord]
    interstitials: list[list[int]]
    chain_index: int = 0
    segment_index: int = 0
    break_reason: str | None = None
    forked_from: str | None = None
    side_call: str | None = None
    drift_turns: int = 0
    drift_tokens: int = 0
    repaired_steps: int = 0
    repaired_tokens: int = 0


@dataclass(frozen=True)
class _Masking:
    """Session-wide facts a trace's mask depends on: retried attempts and staleness."""

    tree: SessionTree
    current_version: int | None
    max_staleness: int | None

    def stale(self, record: CaptureRecord) -> bool:
        if self.max_staleness is None or self.current_version is None:
            return False
        version = record.policy_version
        return version is not None and version < self.current_version - self.max_staleness


def _current_version(given: Any, calls: list[CaptureRecord]) -> int | None:
    """The version staleness is measured against: the caller's, but never older than a call
    the session itself sampled. A trainer stamps its version on a task when it submits it; a
    session that then ran across two updates sampled later calls at newer versions, and
    measuring against the submitted one would call none of its turns stale."""
    newest = max(_versions(calls), default=None)
    if not isinstance(given, int):
        return newest
    return given if newest is None else max(given, newest)


@dataclass
class Grouping:
    """A builder's answer: the segments in output order and any builder-level facts (the
    fields of ``stats`` it sets go into the trajectory's, e.g. prefix_merging's end of turn)."""

    segments: list[Segment]
    stats: TrajectoryStats = field(default_factory=TrajectoryStats)


class Builder(ABC):
    """Turns one session's captured calls into a :class:`Trajectory`."""

    name: ClassVar[str]

    def __init__(self, config: BuilderConfig | Mapping[str, Any] | None = None) -> None:
        if config is None:
            config = BuilderConfig()
        elif not isinstance(config, BuilderConfig):
            try:
                config = BuilderConfig.model_validate(dict(config))
            except ValueError as exc:
                raise ConfigError(f"invalid builder config: {exc}") from exc
        self.config: BuilderConfig = config

    @abstractmethod
    def group(self, calls: list[CaptureRecord]) -> Grouping:
        """Group the session's agent calls (time order, side calls removed) into segments."""

    def build(
        self,
        records: Sequence[CaptureRecord],
        *,
        status: TrajectoryStatus = TrajectoryStatus.COMPLETED,
        metadata: Mapping[str, Any] | None = None,
    ) -> Trajectory:
        """The trajectory of one session; ``status`` says how the session ended. ``metadata``
        holds the caller's session facts (``TrajectoryStats`` fields, e.g. ``session_id``,
        ``group_id``, ``policy_version``); an unknown key is refused."""
        facts = dict(metadata or {})
        # The caller's version is only where staleness is measured from (an int, else
        # ignored); the trajectory states the version it measured against.
        given_version = facts.pop("policy_version", None)
        given = TrajectoryStats.model_validate({"builder": self.name, **facts})
        calls = sorted(records, key=lambda r: (r.seq, r.started_at))
        current = _current_version(given_version, calls)
        if not calls:
            empty = TrajectoryStats(num_calls=0, num_traces=0, delivery=TokenDelivery())
            if metadata is not None and "policy_version" in metadata:
                empty = empty.merged(TrajectoryStats(policy_version=current))
            return Trajectory(
                status=TrajectoryStatus.ERROR,
                metadata=given.merged(empty).written(),
                error="no model calls were captured in this session: nothing to train on",
            )
        agent = [r for r in calls if side_call_kind(r) is None]
        side = [r for r in calls if side_call_kind(r) is not None]
        grouping = self.group(agent) if agent else Grouping([])
        segments = list(grouping.segments)
        excluded: list[str] = []
        if self.config.side_calls == "separate":
            first = max((s.chain_index for s in segments), default=-1) + 1
            segments += [
                Segment([r], [[]], chain_index=first + i, side_call=side_call_kind(r))
                for i, r in enumerate(side)
            ]
        else:
            excluded = [r.completion_id for r in side]
        side_tokens = sum(len(r.sampled_ids) for r in side) if excluded else 0
        eot = grouping.stats.eot_token_id
        tree = session_tree(agent, eot if eot is not None else learn_eot(agent))
        masking = _Masking(tree, current, self.config.max_staleness)
        traces = [self._trace(s, masking) for s in segments]
        _link(traces, segments, tree)
        in_traces = sum(len(s.records) for s in segments)
        if in_traces + len(excluded) != len(calls):
            raise AssertionError(
                f"{self.name} accounted for {in_traces + len(excluded)} of {len(calls)} calls"
            )
        counted = TrajectoryStats(
            policy_version=current,
            num_calls=len(calls),
            calls_in_traces=in_traces,
            excluded_side_calls=excluded,
            delivery=delivery(traces, side_tokens),
        )
        meta = given.merged(grouping.stats, _totals(segments, traces), counted).written()
        if not traces:
            return Trajectory(
                status=TrajectoryStatus.ERROR,
                metadata=meta,
                error=f"all {len(calls)} captured calls were side calls, excluded by config",
            )
        return Trajectory(status=status, traces=traces, metadata=meta)

    def _trace(self, seg: Segment, masking: _Masking) -> Trace:
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] | None = []
        starts: list[int] = []
        for rec, inter in zip(seg.records, seg.interstitials, strict=True):
            response += inter
            mask += [0] * len(inter)
            starts.append(len(response))
            response += rec.sampled_ids
            mask += [1] * len(rec.sampled_ids)
            if logprobs is not None:
                if rec.logprobs is None or len(rec.logprobs) != len(rec.sampled_ids):
                    logprobs = None
                else:
                    logprobs += [0.0] * len(inter)
                    logprobs += rec.logprobs
        untrainable = self._untrainable_reasons(seg.records)
        masked = _mask_spans(seg.records, starts, untrainable, masking)
        for span in masked:
            mask[span.start : span.end] = [0] * (span.end - span.start)
        first, last = seg.records[0], seg.records[-1]
        inexact = inexact_contexts(first.prompt_ids, response, seg.records, starts)
        if inexact and self.config.context == "exact":
            raise AssertionError(
                f"{self.name} merged calls {inexact} into a context their engine prompt "
                "differs from; exact mode must split them"
            )
        stats = self._trace_stats(seg, untrainable, inexact, starts)
        routing = _routing(seg.records, len(first.prompt_ids) + len(response), inexact)
        if routing is not None:  # absent, not null, without it
            stats = stats.merged(TraceStats(routed_experts=routing))
        return Trace(
            prompt_ids=list(first.prompt_ids),
            response_ids=response,
            loss_mask=mask,
            response_logprobs=logprobs,
            prompt_messages=list(first.upstream_request.get("messages") or []),
            response_messages=_response_messages(seg.records),
            tools=list(first.upstream_request.get("tools") or []),
            finish_reason=last.finish_reason,
            masked=masked,
            metadata=stats.written(),
        )

    def _untrainable_reasons(self, records: list[CaptureRecord]) -> list[MaskReason]:
        """Why the whole trace is masked out of the loss (the reasons are its mask spans')."""
        reasons = []
        if not self.config.aborted_trainable and any(is_aborted(r) for r in records):
            reasons.append(MaskReason.ABORTED)
        if not self.config.multi_version_trainable and len(_versions(records)) > 1:
            reasons.append(MaskReason.MULTIPLE_POLICY_VERSIONS)
        return reasons

    def _trace_stats(
        self, seg: Segment, untrainable: list[MaskReason], inexact: list[str], starts: list[int]
    ) -> TraceStats:
        recs = seg.records
        return TraceStats(
            completion_ids=[r.completion_id for r in recs],
            num_calls=len(recs),
            merged_calls=len(recs) - 1,
            context_exact_calls=len(recs) - 1 - len(inexact),
            inexact_context_calls=inexact,
            chain_index=seg.chain_index,
            segment_index=seg.segment_index,
            break_reason=seg.break_reason,
            forked_from=seg.forked_from,
            side_call=seg.side_call,
            drift_turns=seg.drift_turns,
            drift_tokens=seg.drift_tokens,
            repaired_steps=seg.repaired_steps,
            repaired_tokens=seg.repaired_tokens,
            policy_versions=_versions(recs),
            aborted=any(is_aborted(r) for r in recs),
            trainable=not untrainable,
            untrainable_reasons=[str(reason) for reason in untrainable],
            sampled_tokens=sum(len(r.sampled_ids) for r in recs),
            flags=sorted({f for r in recs for f in r.flags}),
            call_spans=[
                (start, start + len(rec.sampled_ids))
                for rec, start in zip(recs, starts, strict=True)
            ],
            call_versions=[rec.policy_version for rec in recs],
        )


def delivery(traces: Sequence[Trace], side_call_tokens: int = 0) -> TokenDelivery:
    """Where the sampled ids of a session's calls went: ``traces`` hold them (each call's
    span, masked for the first of its reasons, or undeliverable in a trace with no prompt),
    ``side_call_tokens`` were left out as side calls."""
    lost = LostTokens().adding(LossReason.SIDE_CALL, side_call_tokens)
    sampled = side_call_tokens
    delivered = 0
    for trace in traces:
        masks: dict[str, set[LossReason]] = {}
        for span in trace.masked:
            masks.setdefault(span.completion_id or "", set()).add(LossReason(span.reason.value))
        stats = trace.stats
        for call, (start, end) in zip(stats.completion_ids, stats.call_spans, strict=True):
            tokens = end - start
            sampled += tokens
            reasons = masks.get(call, set())
            if not trace.prompt_ids:
                lost = lost.adding(LossReason.DRIFT_BREAK, tokens)
            elif reasons:
                lost = lost.adding(next(r for r in MASK_REASONS if r in reasons), tokens)
            else:
                delivered += tokens
    return TokenDelivery(sampled_tokens=sampled, delivered_tokens=delivered, lost=lost)


def inexact_contexts(
    prompt: list[int], response: list[int], records: list[CaptureRecord], starts: list[int]
) -> list[str]:
    """Merged calls whose context in the trace is not exactly their engine prompt.

    Call i's context is the trace prompt plus the response up to ``starts[i]`` (where its
    sampled ids begin); the trainer computes its policy on that, so it must equal the prompt
    the engine conditioned on, token for token.
    """
    bad = []
    for rec, start in zip(records[1:], starts[1:], strict=True):
        ids = rec.prompt_ids
        head = len(prompt)
        if head + start != len(ids) or ids[:head] != prompt or ids[head:] != response[:start]:
            bad.append(rec.completion_id)
    return bad


def side_call_kind(record: CaptureRecord) -> str | None:
    """The side-call kind of a call the gateway tagged ``side_call:<kind>``, else ``None``."""
    for tag in record.tags:
        if tag.startswith(SIDE_CALL_TAG):
            return tag[len(SIDE_CALL_TAG) :] or "unknown"
    return None


def is_aborted(record: CaptureRecord) -> bool:
    """Whether the engine cut this generation short (paused for a weight update)."""
    return FLAG_ABORTED in record.flags or record.finish_reason == ABORT_FINISH_REASON


def _mask_spans(
    records: list[CaptureRecord],
    starts: list[int],
    untrainable: list[MaskReason],
    masking: _Masking,
) -> list[MaskSpan]:
    """Each call's sampled span masked out of the loss, once per reason that applies."""
    spans = []
    for rec, start in zip(records, starts, strict=True):
        reasons = list(untrainable)
        if rec.completion_id in masking.tree.abandoned:
            reasons.append(MaskReason.RETRY_ABANDONED)
        if masking.stale(rec):
            reasons.append(MaskReason.STALE)
        end = start + len(rec.sampled_ids)
        spans += [
            MaskSpan(start=start, end=end, reason=r, completion_id=rec.completion_id)
            for r in reasons
        ]
    return spans


def _link(traces: list[Trace], segments: list[Segment], tree: SessionTree) -> None:
    """Each agent trace's lineage: its first call's link, its parent call's trace."""
    holder = {r.completion_id: i for i, s in enumerate(segments) for r in s.records}
    for trace, seg in zip(traces, segments, strict=True):
        link = tree.links.get(seg.records[0].completion_id)
        if link is None:  # side calls are outside the tree
            continue
        reason = link.reason
        if seg.break_reason is not None and link.relation.value in ("continues", "rewrites"):
            reason = seg.break_reason
        disagreements = [
            found.disagreement
            for r in seg.records
            if (found := tree.links.get(r.completion_id)) is not None and found.disagreement
        ]
        trace.lineage = TraceLineage(
            kind=link.kind,
            parent_trace=holder.get(link.parent) if link.parent is not None else None,
            parent_call=link.parent,
            reason=reason,
            harness=link.harness,
            disagreements=disagreements,
            compaction=link.compaction,
        )


def _versions(records: list[CaptureRecord]) -> list[int]:
    return sorted({r.policy_version for r in records if r.policy_version is not None})


def _response_messages(records: list[CaptureRecord]) -> list[dict[str, Any]]:
    """The structured view of a merged response: each reply, then what the harness added.

    A call's inserted messages are those after the previous call's messages and the
    assistant turn that re-renders the previous reply.
    """
    out: list[dict[str, Any]] = []
    previous: list[Any] | None = None
    for rec in records:
        messages = list(rec.upstream_request.get("messages") or [])
        if previous is not None:
            out += messages[len(previous) + 1 :]
        out.append(rec.response)
        previous = messages
    return out


def _totals(segments: list[Segment], traces: list[Trace]) -> TrajectoryStats:
    breaks = Counter(s.break_reason for s in segments if s.break_reason is not None)
    merged = [s for s in segments if s.side_call is None]
    masked: Counter[str] = Counter()
    for t in traces:
        for span in t.masked:
            masked[span.reason.value] += span.end - span.start
    kinds = Counter(t.lineage.kind.value for t in traces if t.lineage is not None)
    stats = [t.stats for t in traces]
    return TrajectoryStats(
        num_traces=len(traces),
        num_chains=len({s.chain_index for s in segments}),
        breaks=dict(sorted(breaks.items())),
        drift_turns=sum(s.drift_turns for s in segments),
        drift_tokens=sum(s.drift_tokens for s in segments),
        repaired_steps=sum(s.repaired_steps for s in segments),
        repaired_tokens=sum(s.repaired_tokens for s in segments),
        side_call_traces=len(segments) - len(merged),
        completions_per_trace=(
            sum(len(s.records) for s in merged) / len(merged) if merged else 0.0
        ),
        merged_calls=sum(t.merged_calls for t in stats),
        context_exact_calls=sum(t.context_exact_calls for t in stats),
        untrainable_traces=sum(1 for t in stats if not t.trainable),
        masked_tokens=dict(sorted(masked.items())),
        trace_kinds=dict(sorted(kinds.items())),
    )


def _routing(records: list[CaptureRecord], length: int, inexact: list[str]) -> str | None:
    """MoE routing replay: the trace's routed experts (prompt + response - 1 positions, base64
    .npy) when every call captured them and the merged context is the engines' exactly."""
    if inexact or any(r.routed_experts is None for r in records):
        return None
    calls = [(r.routed_experts, len(r.prompt_ids) + len(r.sampled_ids)) for r in records]
    merged = routed_experts.merge(calls, length)
    return routed_experts.encode(merged) if merged is not None else None
