"""The trainer's step metrics carry the delivered fraction of the step's sessions and the
reasons the rest of their sampled tokens were lost."""

from __future__ import annotations

from polar.schemas.task import SessionFailure, SessionResult, SessionStatus
from polar.schemas.trajectory import Trajectory, TrajectoryStatus
from polar.training.trainer import _outcomes


def test_step_metrics_carry_the_delivered_fraction_by_reason() -> None:
    counted = {"sampled_tokens": 10, "delivered_tokens": 7, "lost": {"stale": 3}}
    built = Trajectory(status=TrajectoryStatus.COMPLETED, metadata={"delivery": counted})
    results = [
        SessionResult(
            session_id="s1", task_id="t", status=SessionStatus.COMPLETED, trajectory=built
        ),
        SessionResult(
            session_id="s2",
            task_id="t",
            status=SessionStatus.TIMEOUT,
            trajectory=built,
            failure=SessionFailure(kind="timeout"),
        ),
        SessionResult(session_id="s3", task_id="t", status=SessionStatus.ERROR),
    ]
    record = _outcomes(results)
    assert record["delivered_fraction"] == 7 / 20
    assert record["delivery"] == {
        "fraction": 7 / 20,
        "sampled_tokens": 20,
        "delivered_tokens": 7,
        "lost": {"timeout": 7, "stale": 6},
        "unknown_sessions": 1,
    }
    assert _outcomes([])["delivered_fraction"] == 0.0
