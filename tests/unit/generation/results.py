"""Synthetic session results, shaped as a gateway node reports them."""

from __future__ import annotations

from polar.schemas.task import EvaluationSummary, SessionResult, SessionStatus
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus


def trace(seed: int = 1, reward: float | None = 1.0) -> Trace:
    return Trace(
        prompt_ids=[seed, seed + 1, seed + 2],
        response_ids=[seed + 10, seed + 11, seed + 12, seed + 13],
        loss_mask=[1, 1, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, -0.3],
        prompt_messages=[{"role": "user", "content": f"fix bug {seed}"}],
        response_messages=[
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
            {"role": "assistant", "content": "done"},
        ],
        tools=[{"type": "function", "function": {"name": "shell"}}],
        finish_reason="stop",
        reward=reward,
    )


def result(
    *,
    session_id: str = "ps-1",
    task_id: str = "t-r1",
    sample: int = 0,
    status: SessionStatus = SessionStatus.COMPLETED,
    trajectory_status: TrajectoryStatus | None = None,
    passed: bool | None = True,
    traces: int = 1,
    reward: float | None = None,
    error: str | None = None,
    session_dir: str | None = None,
    seed: int = 1,
) -> SessionResult:
    """A result whose evaluation says ``passed`` (None: no evaluation ran)."""
    reward = reward if reward is not None else (1.0 if passed else 0.0)
    summary = None
    if passed is not None:
        patch = f"diff --git a/x.py b/x.py\n+fix {seed}\n"
        summary = EvaluationSummary(
            verdict=passed, details={"resolved": passed, "model_patch": patch}
        )
    trajectory = None
    if status != SessionStatus.ERROR or trajectory_status is not None:
        trajectory = Trajectory(
            status=trajectory_status or TrajectoryStatus(status.value),
            traces=[trace(seed + 100 * i, reward) for i in range(traces)],
            metadata={"session_id": session_id, "task_id": task_id},
        )
    return SessionResult(
        session_id=session_id,
        task_id=task_id,
        status=status,
        trajectory=trajectory,
        reward=reward if passed is not None else None,
        timing={"total": 12.5},
        error=error,
        sample_index=sample,
        session_dir=session_dir or None,
        evaluation=summary,
    )
