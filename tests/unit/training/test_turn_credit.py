"""Turn-level advantages: the session's advantage plus each scored turn's centred reward."""

from __future__ import annotations

import pytest
import torch

from polar.schemas.task import SessionResult
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus, TurnReward
from polar.training.advantages import SessionSample, compute_advantages
from polar.training.batch import make_batch
from polar.training.config import AdvantageConfig
from polar.training.turn_credit import turn_reward_report


def trace(turns: list[tuple[int, int, float]], n: int = 6) -> Trace:
    return Trace(
        prompt_ids=[1, 2],
        response_ids=list(range(10, 10 + n)),
        loss_mask=[1] * n,
        turn_rewards=[
            TurnReward(start=a, end=b, reward=r, source="tool_errors", completion_id=f"c{a}")
            for a, b, r in turns
        ],
    )


def group() -> list[SessionSample]:
    # session a: a failed tool call (-1) then a clean one (0); session b: one clean turn (0)
    a = SessionSample("a", "g", "COMPLETED", 1.0, (trace([(0, 2, -1.0), (3, 5, 0.0)]),))
    b = SessionSample("b", "g", "COMPLETED", 0.0, (trace([(0, 2, 0.0)]),))
    return [a, b]


def test_off_by_default_every_token_shares_the_session_advantage():
    scored, _ = compute_advantages(group())
    assert all(s.token_bonus is None for s in scored)
    assert make_batch(scored, [1.0, 1.0]).advantages.shape == (2,)


def test_turn_rewards_are_centred_on_the_group_and_weighted():
    config = AdvantageConfig(turn_reward_weight=0.5, std_normalize=False)
    a, b = compute_advantages(group(), config)[0]
    baseline = -1.0 / 3  # mean of the group's scored calls: -1, 0, 0
    assert a.advantage == pytest.approx(0.5) and b.advantage == pytest.approx(-0.5)
    assert a.token_bonus == pytest.approx(
        [0.5 * (-1 - baseline)] * 2 + [0.0] + [0.5 * (0 - baseline)] * 2 + [0.0]
    )
    assert b.token_bonus == pytest.approx([0.5 * (0 - baseline)] * 2 + [0.0] * 4)
    batch = make_batch([a, b], [1.0, 1.0])
    assert batch.advantages.shape == (2, 6) and a.token_bonus is not None
    assert torch.allclose(
        batch.advantages[0], torch.tensor([0.5 + x for x in a.token_bonus], dtype=torch.float32)
    )


def test_zeroed_failures_get_no_turn_bonus():
    timeout = SessionSample("c", "g", "TIMEOUT", None, (trace([(0, 2, -1.0)]),))
    scored, _ = compute_advantages([*group(), timeout], AdvantageConfig(turn_reward_weight=1.0))
    (zeroed,) = [s for s in scored if s.session_id == "c"]
    assert zeroed.advantage == 0.0 and zeroed.token_bonus is None


def test_the_tool_use_source_passes_turn_reward_hooks_to_its_tasks():
    from polar.training.tool_use import tool_use

    hooks = [{"strategy": "tool_errors"}]
    (task,) = tool_use("train", 1, 1, turn_rewards=hooks, runtime="local")
    assert [spec.strategy for spec in task.turn_rewards] == ["tool_errors"]
    (plain,) = tool_use("train", 1, 1, runtime="local")
    assert plain.turn_rewards == []


def test_the_step_report_counts_scored_failed_and_unscored():
    def result(sid: str, *traces: Trace) -> SessionResult:
        traj = Trajectory(status=TrajectoryStatus.COMPLETED, traces=list(traces))
        return SessionResult(session_id=sid, task_id="t", status="COMPLETED", trajectory=traj)

    a, b = group()
    report = turn_reward_report(
        [result("a", *a.traces), result("b", *b.traces), result("c", trace([]))]
    )
    assert report == {
        "calls": 3,  # one trace of one call each
        "scored": 3,
        "negative": 1,
        "mean": pytest.approx(-1 / 3),
        "sessions_unscored": 1,
    }
