"""Every export target round-trips: trajectory -> rows -> file -> rows -> identical traces."""

from __future__ import annotations

from typing import Any

import pytest

from polar.errors import ConfigError
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus
from polar.trajectory.exporters.registry import create_exporter, exporters
from polar.trajectory.exporters.trl import TRLExporter
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from .sessions import TOOLS, Agent, record

NAMES = ["slime", "verl", "trl", "nemo_rl", "jsonl", "parquet", "sft"]


@pytest.fixture(scope="module")
def trajectories(smollm2: Any) -> list[Trajectory]:
    agent = Agent(smollm2, tools=TOOLS)
    agent.call("Let me look.", tool_cmd="ls")
    agent.tool_result("a.py")
    agent.call("Done.")
    main = PrefixMergingBuilder().build(
        agent.records, metadata={"session_id": "s1", "group_id": "g1", "policy_version": 2}
    )
    main.traces[0].reward = 1.0
    odd = [
        record([1, 2], [10, 2], logprobs=None),  # no logprobs: trace logprobs null
        record([3, 4], [11, 12], finish="length", flags=["aborted"]),  # untrainable
    ]
    other = PrefixMergingBuilder().build(odd, status=TrajectoryStatus.TIMEOUT)
    return [main, other]


def traces_of(trajectories: list[Trajectory]) -> list[Trace]:
    return [t for traj in trajectories for t in traj.traces]


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_through_a_file(name, trajectories, tmp_path):
    exporter = create_exporter(name)
    path = tmp_path / f"out.{name}"
    assert exporter.write(trajectories, path) == 3
    back = [exporter.trace(row) for row in exporter.read(path)]
    expected = traces_of(trajectories)
    if name == "sft":  # SFT data carries no logprobs
        expected = [t.model_copy(update={"response_logprobs": None}) for t in expected]
    assert back == expected


def test_registry_knows_every_target_and_import_paths():
    assert set(NAMES) <= set(exporters.names())
    assert isinstance(create_exporter("polar.trajectory.exporters.trl:TRLExporter"), TRLExporter)
    with pytest.raises(ConfigError):
        create_exporter("nope")


def test_slime_sample_shape(trajectories, smollm2):
    row = next(create_exporter("slime", tokenizer=smollm2).rows(trajectories))
    trace = trajectories[0].traces[0]
    assert row["tokens"] == trace.prompt_ids + trace.response_ids
    assert row["response_length"] == len(trace.response_ids) == len(row["loss_mask"])
    assert row["rollout_log_probs"] == trace.response_logprobs
    assert row["status"] == "completed" and row["reward"] == 1.0
    assert row["response"] == smollm2.decode(trace.response_ids)
    assert row["metadata"]["session"]["group_id"] == "g1"
    statuses = [r["status"] for r in create_exporter("slime").rows(trajectories)]
    assert statuses == ["completed", "completed", "aborted"]


def test_verl_agent_loop_output_shape(trajectories):
    row = next(create_exporter("verl").rows(trajectories))
    trace = trajectories[0].traces[0]
    assert row["response_mask"] == trace.loss_mask
    assert row["reward_score"] == 1.0
    assert row["num_turns"] == len(trace.prompt_messages) + len(trace.response_messages)
    assert row["extra_fields"]["session"]["session_id"] == "s1"


def test_trl_rollout_func_columns(trajectories):
    exporter = TRLExporter()
    out = exporter.rollout_output(trajectories)
    assert {"prompt_ids", "completion_ids", "logprobs", "env_mask"} <= set(out)
    assert len(out["prompt_ids"]) == 3
    assert out["env_mask"][0] == trajectories[0].traces[0].loss_mask
    assert out["logprobs"][1] is None
    assert exporter.traces_from_output(out) == traces_of(trajectories)


def test_nemo_rl_message_log(trajectories):
    row = next(create_exporter("nemo_rl").rows(trajectories))
    trace = trajectories[0].traces[0]
    log = row["message_log"]
    assert log[0]["token_ids"] == trace.prompt_ids
    assert [m["role"] for m in log[1:]] == ["assistant", "environment", "assistant"]
    assert [t for m in log[1:] for t in m["token_ids"]] == trace.response_ids
    sampled_lp = [lp for m in log if m["role"] == "assistant" for lp in m["generation_logprobs"]]
    assert sampled_lp == [
        lp for lp, m in zip(trace.response_logprobs, trace.loss_mask, strict=True) if m
    ]
    untrainable = list(create_exporter("nemo_rl").rows(trajectories))[2]
    assert untrainable["loss_multiplier"] == 0.0


def test_sft_conversation_has_messages_tools_and_ids(trajectories):
    row = next(create_exporter("sft").rows(trajectories))
    trace = trajectories[0].traces[0]
    assert row["messages"][0]["role"] == "system"
    assert any(m.get("tool_calls") for m in row["messages"] if m["role"] == "assistant")
    assert row["tools"] == TOOLS
    assert row["input_ids"] == trace.prompt_ids + trace.response_ids
    assert sum(row["assistant_masks"]) == sum(trace.loss_mask)


def test_parquet_columns_are_typed(trajectories, tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    create_exporter("parquet", batch_rows=2).write(trajectories, path)
    table = pq.read_table(path)
    assert table.num_rows == 3
    assert str(table.schema.field("prompt_ids").type) == "list<element: int32>"
    assert str(table.schema.field("response_logprobs").type) == "list<element: double>"
