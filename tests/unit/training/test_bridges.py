"""Bridge conversions against the trainers' documented shapes (see shared ENGINES.md):
slime Samples, verl AgentLoopOutput fields, TRL rollout_func columns; failure handling."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest

from polar.schemas.task import (
    SessionFailure,
    SessionResult,
    SessionStatus,
    TaskRequest,
    TaskResult,
)
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus
from polar.training.bridges.sessions import main_trace, session_rows
from polar.training.bridges.slime import PolarSlimeRollout, fill_sample, group_fields
from polar.training.bridges.trl import PolarRolloutFunc, group_prompts, polar_reward, prompt_text
from polar.training.bridges.verl import PolarAgentLoop

# prompt [1, 2, 3], two sampled turns with tool output (50, 51) masked between them
MERGED = Trace(
    prompt_ids=[1, 2, 3],
    response_ids=[10, 11, 99, 50, 51, 20, 21, 99],
    loss_mask=[1, 1, 1, 0, 0, 1, 1, 1],
    response_logprobs=[-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5, -0.6],
    finish_reason="stop",
    reward=1.0,
    metadata={"policy_versions": [3]},
)
SIDE = Trace(prompt_ids=[7], response_ids=[8, 99], loss_mask=[1, 1], response_logprobs=[-1.0, -1.0])


def result(
    sid: str,
    index: int,
    *,
    status: SessionStatus = SessionStatus.COMPLETED,
    reward: float | None = 1.0,
    traces: list[Trace] | None = None,
    failure: str | None = None,
) -> SessionResult:
    trajectory = None
    if traces is not None:
        trajectory = Trajectory(
            status=TrajectoryStatus.COMPLETED
            if status == SessionStatus.COMPLETED
            else TrajectoryStatus(status.value),
            traces=traces,
            metadata={"group_id": "g", "policy_version": 3, "session_id": sid},
        )
    return SessionResult(
        session_id=sid,
        task_id="t",
        status=status,
        reward=reward,
        trajectory=trajectory,
        failure=SessionFailure(kind=failure, reason="r") if failure else None,  # type: ignore[arg-type]
        metadata={"sample_index": index},
    )


def task_result() -> TaskResult:
    return TaskResult(
        task_id="t",
        status="COMPLETED",
        results=[
            result("s2", 2, status=SessionStatus.ERROR, reward=None),
            result("s0", 0, traces=[SIDE, MERGED.model_copy(update={"reward": 1.0})]),
            result("s1", 1, reward=0.0, traces=[MERGED.model_copy(update={"reward": 0.0})]),
            result("s3", 3, status=SessionStatus.TIMEOUT, reward=0.0, traces=[MERGED]),
        ],
    )


def test_main_trace_is_the_one_with_most_trainable_tokens() -> None:
    assert main_trace([SIDE, MERGED]) is MERGED
    assert main_trace([]) is None


def test_session_rows_order_failures_and_left_out_traces() -> None:
    rows = session_rows(task_result(), expected=4)
    assert [r.result.session_id for r in rows] == ["s0", "s1", "s2", "s3"]
    assert [r.reward for r in rows] == [1.0, 0.0, None, None]
    assert [r.trainable for r in rows] == [True, True, False, False]
    assert rows[0].left_out_traces == 1 and rows[0].trace == MERGED.model_copy(
        update={"reward": 1.0}
    )
    penalized = session_rows(task_result(), expected=4, on_failure="penalize", failure_reward=-1.0)
    # a failed session with tokens keeps them and scores the failure reward
    assert [r.reward for r in penalized] == [1.0, 0.0, None, -1.0]
    assert penalized[3].trainable
    with pytest.raises(ValueError, match="expected 5"):
        session_rows(task_result(), expected=5)


def infra_group() -> TaskResult:
    """Two scored sessions, a harness crash and a node lost mid-session (tokens kept)."""
    merged = MERGED.model_copy(update={"reward": 1.0})
    return TaskResult(
        task_id="t",
        status="COMPLETED",
        results=[
            result("s0", 0, traces=[merged]),
            result("s1", 1, reward=0.0, traces=[merged]),
            result(
                "s2", 2, status=SessionStatus.ERROR, reward=None, traces=[merged], failure="agent"
            ),
            result(
                "s3", 3, status=SessionStatus.ERROR, reward=None, traces=[merged], failure="infra"
            ),
        ],
    )


def test_infra_failures_are_never_penalized_unless_asked() -> None:
    rows = session_rows(infra_group(), expected=4, on_failure="penalize", failure_reward=-1.0)
    assert [r.reward for r in rows] == [1.0, 0.0, -1.0, None]
    assert [r.trainable for r in rows] == [True, True, True, False]
    assert rows[3].infra_failure and rows[3].session["failure_kind"] == "infra"
    kept = session_rows(
        infra_group(),
        expected=4,
        on_failure="penalize",
        failure_reward=-1.0,
        drop_infra_failures=False,
    )
    assert [r.reward for r in kept] == [1.0, 0.0, -1.0, -1.0]
    # slime: the infra row takes the mean of the scored ones (1, 0, -1), leaving the baseline
    fields = group_fields(rows)
    assert fields[3]["reward"] == pytest.approx(0.0) and fields[3]["remove_sample"] is True
    assert [f["reward"] for f in group_fields(kept)] == [1.0, 0.0, -1.0, -1.0]


# -- slime ---------------------------------------------------------------------------------


@dataclass
class Sample:
    """The fields of slime's ``Sample`` the bridge reads or writes (slime/utils/types.py)."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)


def test_slime_samples_from_a_group() -> None:
    rows = session_rows(task_result(), expected=4)
    group = [Sample(group_index=0, index=i, prompt="p", metadata={"keep": i}) for i in range(4)]
    filled = [fill_sample(s, f) for s, f in zip(group, group_fields(rows), strict=True)]
    ok, zero, err, late = filled
    assert ok.tokens == MERGED.prompt_ids + MERGED.response_ids
    assert ok.response_length == len(MERGED.response_ids)
    assert ok.loss_mask == MERGED.loss_mask
    assert ok.rollout_log_probs == MERGED.response_logprobs
    assert ok.reward == 1.0 and ok.status is Sample.Status.COMPLETED and not ok.remove_sample
    assert ok.weight_versions == ["3"]
    assert ok.metadata["keep"] == 0 and ok.metadata["polar"]["left_out_traces"] == 1
    assert ok.metadata["polar"]["session_id"] == "s0"
    assert zero.reward == 0.0
    # failed slots: neutral reward (the group's mean), nothing trainable, flagged
    assert err.status is Sample.Status.FAILED and err.remove_sample and err.reward == 0.5
    assert err.tokens == [] and err.response_length == 0
    assert late.status is Sample.Status.TRUNCATED and late.remove_sample and late.reward == 0.5
    assert late.loss_mask == [0] * len(MERGED.response_ids)
    assert late.tokens == MERGED.prompt_ids + MERGED.response_ids


def test_slime_length_stop_is_truncated_and_dicts_work() -> None:
    cut = MERGED.model_copy(update={"finish_reason": "length"})
    rows = session_rows(
        TaskResult(task_id="t", status="COMPLETED", results=[result("a", 0, traces=[cut])]),
        expected=1,
    )
    [fields] = group_fields(rows)
    sample = fill_sample({"index": 0, "metadata": {"x": 1}}, fields)
    assert sample["status"] == "truncated" and sample["metadata"]["x"] == 1


class FakeClient:
    """Records submitted tasks; answers each with the canned task result."""

    def __init__(self, answer: TaskResult) -> None:
        self.answer = answer
        self.submitted: list[TaskRequest] = []

    def run(self, tasks: list[TaskRequest], timeout_s: float) -> list[TaskResult]:
        self.submitted.extend(tasks)
        n = tasks[0].num_samples
        return [
            self.answer.model_copy(
                update={"task_id": t.task_id, "results": self.answer.results[:n]}
            )
            for t in tasks
        ]

    def node_urls(self) -> list[str]:
        return []


def base_task(_: Any = None, index: int = 0) -> TaskRequest:
    return TaskRequest(task_id=f"base{index}", instruction="do it")


def test_slime_rollout_groups_tasks_and_stamps_the_rollout_id() -> None:
    bridge = PolarSlimeRollout("http://unused", lambda sample: base_task())
    bridge.client = FakeClient(task_result())  # type: ignore[assignment]
    groups = [[Sample(group_index=g, index=i) for i in range(4)] for g in range(2)]
    filled = bridge.rollout(groups, rollout_id=7)
    submitted = bridge.client.submitted  # type: ignore[attr-defined]
    assert [t.num_samples for t in submitted] == [4, 4]
    assert (
        submitted[0].metadata["policy_version"] == 7 and submitted[0].metadata["rollout_step"] == 7
    )
    assert len({t.task_id for t in submitted}) == 2
    assert [len(g) for g in filled] == [4, 4] and filled[1][0].reward == 1.0


# -- verl ----------------------------------------------------------------------------------

VERL_FIELDS = {
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "routed_experts",  # verl's MoE routing replay (None without a MoE engine's capture)
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
}


def one(res: SessionResult) -> TaskResult:
    return TaskResult(task_id="t", status="COMPLETED", results=[res])


def test_verl_agent_loop_output() -> None:
    loop = PolarAgentLoop("http://unused", lambda row: base_task(), response_length=6)
    loop.client = FakeClient(one(result("a", 0, traces=[SIDE, MERGED])))  # type: ignore[assignment]
    out = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "x"}]))
    assert set(out) == VERL_FIELDS
    assert out["prompt_ids"] == [1, 2, 3]
    # cut at rollout.response_length, mask and logprobs with it
    assert out["response_ids"] == MERGED.response_ids[:6]
    assert out["response_mask"] == MERGED.loss_mask[:6]
    assert out["response_logprobs"] == MERGED.response_logprobs[:6]  # type: ignore[index]
    assert out["reward_score"] == 1.0
    polar = out["extra_fields"]["polar"]
    assert polar["truncated"] is True and polar["left_out_traces"] == 1
    assert polar["session"]["session_id"] == "a"
    [task] = loop.client.submitted  # type: ignore[attr-defined]
    assert task.num_samples == 1


class SequenceClient(FakeClient):
    """Answers each run with the next canned result."""

    def __init__(self, answers: list[SessionResult]) -> None:
        super().__init__(one(answers[0]))
        self.answers = answers

    def run(self, tasks: list[TaskRequest], timeout_s: float) -> list[TaskResult]:
        self.submitted.extend(tasks)
        return [one(self.answers[len(self.submitted) - 1])]


def test_verl_reruns_an_infra_failure_so_the_slot_holds_a_real_sample() -> None:
    lost = result("lost", 0, status=SessionStatus.ERROR, reward=None, failure="infra")
    good = result("good", 0, reward=0.0, traces=[MERGED])
    loop = PolarAgentLoop("http://unused", lambda row: base_task())
    loop.client = SequenceClient([lost, good])  # type: ignore[assignment]
    out = asyncio.run(loop.run({}))
    assert out["reward_score"] == 0.0 and out["response_mask"] == MERGED.loss_mask
    assert out["extra_fields"]["polar"]["infra_retries"] == 1
    ids = [t.task_id for t in loop.client.submitted]  # type: ignore[attr-defined]
    assert len(ids) == 2 and len(set(ids)) == 2  # a fresh task, never the same id again

    always = PolarAgentLoop("http://unused", lambda row: base_task(), infra_retries=1)
    lost_with_tokens = result(
        "lost", 0, status=SessionStatus.ERROR, reward=None, traces=[MERGED], failure="infra"
    )
    always.client = SequenceClient([lost_with_tokens] * 3)  # type: ignore[assignment]
    out = asyncio.run(always.run({}))
    polar = out["extra_fields"]["polar"]
    assert polar["infra_retries"] == 1 and polar["failure_kind"] == "infra"
    assert set(out["response_mask"]) == {0} and len(always.client.submitted) == 2  # type: ignore[attr-defined]

    off = PolarAgentLoop("http://unused", lambda row: base_task(), drop_infra_failures=False)
    off.client = SequenceClient([lost_with_tokens, good])  # type: ignore[assignment]
    assert asyncio.run(off.run({}))["extra_fields"]["polar"]["infra_retries"] == 0


def test_verl_failed_session_teaches_nothing_and_long_prompts_are_refused() -> None:
    loop = PolarAgentLoop("http://unused", lambda row: base_task())
    loop.client = FakeClient(  # type: ignore[assignment]
        one(result("a", 0, status=SessionStatus.TIMEOUT, reward=1.0, traces=[MERGED]))
    )
    out = asyncio.run(loop.run({}))
    assert out["reward_score"] == 0.0 and set(out["response_mask"]) == {0}
    strict = PolarAgentLoop("http://unused", lambda row: base_task(), prompt_length=2)
    strict.client = FakeClient(one(result("a", 0, traces=[MERGED])))  # type: ignore[assignment]
    with pytest.raises(ValueError, match="prompt_length"):
        asyncio.run(strict.run({}))


# -- TRL -----------------------------------------------------------------------------------


class FakeTokenizer:
    eos_token_id = 2
    bos_token_id = 1


class FakeTrainer:
    num_generations = 4
    num_generations_eval = 4
    processing_class = FakeTokenizer()

    class state:
        global_step = 5


def test_trl_rollout_columns() -> None:
    func = PolarRolloutFunc("http://unused", lambda prompt, i: base_task(index=i))
    func.client = FakeClient(task_result())  # type: ignore[assignment]
    prompt = [{"role": "user", "content": "add"}]
    out = func([prompt] * 4, FakeTrainer())
    assert {"prompt_ids", "completion_ids", "logprobs", "env_mask", "reward"} <= set(out)
    assert all(len(v) == 4 for v in out.values())
    assert out["completion_ids"][0] == MERGED.response_ids
    assert out["env_mask"][0] == MERGED.loss_mask
    assert out["env_mask"][3] == [0] * len(MERGED.response_ids)  # timed out: masked
    assert out["completion_ids"][2] == [2] and out["env_mask"][2] == [0]  # no trace: placeholder
    assert out["reward"] == [1.0, 0.0, None, None]
    assert out["polar_left_out_traces"] == [1, 0, 0, 0]
    assert polar_reward([], [], out["reward"]) == [1.0, 0.0, None, None]
    [task] = func.client.submitted  # type: ignore[attr-defined]
    assert task.num_samples == 4 and task.metadata["rollout_step"] == 5


def test_trl_infra_failures_are_unscorable_even_when_penalizing() -> None:
    func = PolarRolloutFunc(
        "http://unused", lambda prompt, i: base_task(index=i), on_failure="penalize"
    )
    func.client = FakeClient(infra_group())  # type: ignore[assignment]
    out = func(["p"] * 4, FakeTrainer())
    assert out["reward"] == [1.0, 0.0, 0.0, None]  # TRL leaves None out of the group's mean
    assert out["env_mask"][3] == [0] * len(MERGED.response_ids)


def test_trl_prompt_grouping() -> None:
    assert group_prompts(["a", "a", "b", "b"], 2) == ["a", "b"]
    with pytest.raises(ValueError, match="differ"):
        group_prompts(["a", "b"], 2)
    with pytest.raises(ValueError, match="groups of 3"):
        group_prompts(["a", "a"], 3)
    assert (
        prompt_text([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) == "u"
    )
    assert prompt_text([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) == "hi"
