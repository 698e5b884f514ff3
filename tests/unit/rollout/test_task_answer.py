"""GET /tasks/{id} answers from the stored documents: equal to the parsed results, written
once for a COMPLETED task, unchanged when the task id is submitted again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.rollout.config import RolloutServerConfig
from polar.rollout.service import RolloutService
from polar.rollout.store import TaskConflict
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest, TaskResult, TaskStatus


async def finish_all(service: RolloutService, task_id: str, reward: float) -> None:
    for view in service.session_views(task_id):
        await service.accept_result(
            SessionResult(
                session_id=view.session_id,
                task_id=task_id,
                status=SessionStatus.COMPLETED,
                reward=reward,
                metadata={"note": 'quotes " and \\ backslashes, ünïcode'},
            )
        )


def parsed(body: bytes | Path | None) -> TaskResult:
    assert body is not None
    raw = body.read_bytes() if isinstance(body, Path) else body
    json.loads(raw)  # well-formed JSON, not only what pydantic accepts
    return TaskResult.model_validate_json(raw)


async def test_answer_is_spliced_then_kept_and_never_replaced(tmp_path: Path) -> None:
    service = RolloutService(RolloutServerConfig(data_dir=tmp_path))
    try:
        await service.submit(TaskRequest(task_id="t", instruction="x", num_samples=3))
        running = service.task_result_json("t")
        assert isinstance(running, bytes)
        assert parsed(running).status is TaskStatus.RUNNING and parsed(running).results == []

        await finish_all(service, "t", reward=1.0)
        first = service.task_result_json("t")
        assert isinstance(first, bytes)  # built now, and written for next time
        again = service.task_result_json("t")
        assert isinstance(again, Path)
        assert parsed(first) == parsed(again)
        result = parsed(again)
        assert result.status is TaskStatus.COMPLETED
        assert [r.reward for r in result.results] == [1.0, 1.0, 1.0]
        assert result.results[0].metadata["note"].endswith("ünïcode")

        # The same request again answers the finished task; a different one is refused.
        summary, created = await service.submit(
            TaskRequest(task_id="t", instruction="x", num_samples=3)
        )
        assert not created and summary.status is TaskStatus.COMPLETED
        with pytest.raises(TaskConflict):
            await service.submit(TaskRequest(task_id="t", instruction="x", num_samples=2))
        assert parsed(service.task_result_json("t")) == result
        assert service.task_result_json("missing") is None
    finally:
        await service.stop()
