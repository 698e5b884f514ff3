"""Staleness at consumption: each call is judged against the trainer's version when it takes
the session; the builder's stamps and masks stay as they were."""

from __future__ import annotations

from polar.schemas.trajectory import MaskReason, MaskSpan, Trace
from polar.training.advantages import SessionSample
from polar.training.staleness import mask_stale_samples, mask_stale_trace


def trace(versions: list[int | None], *, built_stale: tuple[int, ...] = ()) -> Trace:
    """Calls of 2 sampled tokens each, separated by one interstitial (masked) token."""
    response, mask, spans, ids = [], [], [], []
    for i, _ in enumerate(versions):
        if i:
            response.append(0)
            mask.append(0)
        start = len(response)
        response += [7, 8]
        mask += [0, 0] if i in built_stale else [1, 1]
        spans.append((start, start + 2))
        ids.append(f"c{i}")
    masked = [
        MaskSpan(start=spans[i][0], end=spans[i][1], reason=MaskReason.STALE, completion_id=f"c{i}")
        for i in built_stale
    ]
    return Trace(
        prompt_ids=[1, 2],
        response_ids=response,
        loss_mask=mask,
        masked=masked,
        metadata={"completion_ids": ids, "call_versions": versions, "call_spans": spans},
    )


def test_a_session_sampled_wholly_at_version_0_is_masked_when_consumed_at_version_2() -> None:
    judged, done = mask_stale_trace(trace([0, 0, 0]), current_version=2, max_staleness=1)
    assert judged.loss_mask == [0] * 8
    assert [(s.completion_id, s.reason) for s in judged.masked] == [
        (f"c{i}", MaskReason.STALE) for i in range(3)
    ]
    assert (done.masked_calls, done.masked_tokens) == (3, 6)
    assert judged.stats.call_versions == [0, 0, 0]  # the stamps stay facts


def test_a_session_spanning_versions_is_masked_call_by_call() -> None:
    original = trace([0, 1, 2, None], built_stale=(0,))
    judged, done = mask_stale_trace(original, current_version=3, max_staleness=1)
    # lag 3 (masked by the builder already), lag 2 (masked now), lag 1 and unversioned: kept
    assert judged.loss_mask == [0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1]
    assert [s.completion_id for s in judged.masked] == ["c0", "c1"]
    assert (done.masked_calls, done.masked_tokens) == (1, 2)
    assert original.loss_mask[3:5] == [1, 1]  # the built trace is not changed in place


def test_nothing_is_judged_without_a_bound_or_within_it() -> None:
    samples = [SessionSample("s", "g", "COMPLETED", 1.0, traces=(trace([0, 1]),))]
    same, done = mask_stale_samples(samples, current_version=9, max_staleness=None)
    assert same is samples and done.masked_calls == 0
    kept, done = mask_stale_samples(samples, current_version=1, max_staleness=1)
    assert kept[0].traces[0].loss_mask == samples[0].traces[0].loss_mask
    assert done.masked_calls == 0
    judged, done = mask_stale_samples(samples, current_version=2, max_staleness=0)
    assert judged[0].traces[0].loss_mask == [0, 0, 0, 0, 0]
    assert done.masked_calls == 2
