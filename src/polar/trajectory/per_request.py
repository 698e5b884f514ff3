"""per_request: one trace per model call, every sampled token trainable.

The simplest faithful builder and the baseline prefix_merging is measured against: nothing is
merged, so nothing can drift, at the cost of one trainer sequence per call.
"""

from __future__ import annotations

from polar.capture.records import CaptureRecord
from polar.trajectory.base import Builder, Grouping, Segment


class PerRequestBuilder(Builder):
    """Each captured call becomes its own trace (prompt = its prompt, response = its sample)."""

    name = "per_request"

    def group(self, calls: list[CaptureRecord]) -> Grouping:
        return Grouping([Segment([r], [[]], chain_index=i) for i, r in enumerate(calls)])
