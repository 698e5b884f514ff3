"""Staleness judged when the trainer consumes a session, not when the node built it.

A builder stamps each call with the policy version it was sampled at and masks, at build
time, the calls already too old then. In asynchronous RL a session can finish at version 0 and
reach the trainer only after two updates: at build time nothing of it was stale, at
consumption all of it is. So the trainer measures every call against its *own* version when
it takes the session and masks (reason ``stale``) those older than ``max_staleness``; the
builder's stamps and masks stay as facts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polar.schemas.trajectory import MaskReason, MaskSpan, Trace
from polar.training.advantages import SessionSample


@dataclass(frozen=True)
class Consumed:
    """What consumption-time staleness did to one step's sessions."""

    masked_calls: int = 0
    """Calls masked now that the builder had left trainable."""
    masked_tokens: int = 0
    """Of those calls, sampled tokens that were trainable before."""


def mask_stale_trace(
    trace: Trace, current_version: int, max_staleness: int
) -> tuple[Trace, Consumed]:
    """``trace`` with every call sampled before ``current_version - max_staleness`` masked
    ``stale`` (calls already masked so are left as they are), and what it newly masked.
    A call with no recorded version is never judged stale."""
    stats = trace.stats
    already = {s.completion_id for s in trace.masked if s.reason is MaskReason.STALE}
    mask = list(trace.loss_mask)
    spans = list(trace.masked)
    newly = tokens = 0
    for completion_id, version, (start, end) in zip(
        stats.completion_ids, stats.call_versions, stats.call_spans, strict=True
    ):
        if version is None or version >= current_version - max_staleness:
            continue
        if completion_id in already:
            continue
        tokens += sum(mask[start:end])
        mask[start:end] = [0] * (end - start)
        spans.append(
            MaskSpan(start=start, end=end, reason=MaskReason.STALE, completion_id=completion_id)
        )
        newly += 1
    if not newly:
        return trace, Consumed()
    judged = trace.model_copy(update={"loss_mask": mask, "masked": spans})
    return judged, Consumed(masked_calls=newly, masked_tokens=tokens)


def mask_stale_samples(
    samples: list[SessionSample], current_version: int, max_staleness: int | None
) -> tuple[list[SessionSample], Consumed]:
    """Every sample's traces judged against the trainer's ``current_version``; unchanged when
    ``max_staleness`` is None."""
    if max_staleness is None:
        return samples, Consumed()
    out: list[SessionSample] = []
    calls = tokens = 0
    for sample in samples:
        traces = []
        for trace in sample.traces:
            judged, done = mask_stale_trace(trace, current_version, max_staleness)
            calls += done.masked_calls
            tokens += done.masked_tokens
            traces.append(judged)
        out.append(replace(sample, traces=tuple(traces)))
    return out, Consumed(masked_calls=calls, masked_tokens=tokens)
