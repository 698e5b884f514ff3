"""per_request: one trace per call, loss mask all 1, the same bookkeeping as prefix_merging."""

from __future__ import annotations

from polar.schemas.trajectory import TrajectoryStatus
from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.registry import create_builder

from .sessions import record


def test_one_trace_per_call_with_full_mask():
    r1 = record([1, 2, 3], [10, 11, 99])
    r2 = record([1, 2, 3, 10, 11, 99, 50, 51], [20, 21, 99])
    traj = create_builder("per_request").build([r1, r2])
    assert isinstance(create_builder("per_request"), PerRequestBuilder)
    assert [(t.prompt_ids, t.response_ids, t.loss_mask) for t in traj.traces] == [
        ([1, 2, 3], [10, 11, 99], [1, 1, 1]),
        ([1, 2, 3, 10, 11, 99, 50, 51], [20, 21, 99], [1, 1, 1]),
    ]
    assert [t.response_logprobs for t in traj.traces] == [r1.logprobs, r2.logprobs]
    assert [t.metadata["chain_index"] for t in traj.traces] == [0, 1]
    assert traj.metadata["completions_per_trace"] == 1.0
    assert traj.metadata["builder"] == "per_request"


def test_side_calls_and_trainability_apply_too():
    r1 = record([1], [10, 99], policy_version=1)
    side = record([2], [11, 99], tags=["side_call:routing"])
    aborted = record([3], [12], finish="abort")
    traj = PerRequestBuilder({"side_calls": "separate"}).build([r1, side, aborted])
    by_id = {t.metadata["completion_ids"][0]: t for t in traj.traces}
    assert by_id[side.completion_id].metadata["side_call"] == "routing"
    assert by_id[aborted.completion_id].metadata["aborted"] is True
    assert by_id[aborted.completion_id].loss_mask == [0]
    assert by_id[r1.completion_id].metadata["policy_versions"] == [1]


def test_zero_calls_is_an_error():
    traj = PerRequestBuilder().build([])
    assert traj.status == TrajectoryStatus.ERROR
    assert traj.error
