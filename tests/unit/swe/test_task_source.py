"""SWE instances as the trainer's ``swe`` task source: disjoint, stable splits and runnable
tasks (the bundled set's repositories bundled on first use)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.errors import ConfigError
from polar.swe.bundled import bundle_head, bundled_instances
from polar.swe.instances import SWEInstance
from polar.swe.task_source import split_instances
from polar.training.tasks import task_source
from polar.training.trainer_config import TrainConfig

from .records import GYM


def test_the_bundled_set_becomes_runnable_local_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_SWE_BUNDLES", str(tmp_path / "bundles"))
    source = task_source("swe")
    tasks = source("train", 0, 5, 0, harness="claude_code", num_samples=2)
    assert len(tasks) == 5
    commits = {i.instance_id: i.base_commit for i in bundled_instances()}
    for task in tasks:
        assert task.agent.harness == "claude_code" and task.num_samples == 2
        assert task.evaluator.strategy == "swe_tests"
        git = task.runtime.source
        assert git is not None and git.repo is not None
        assert Path(git.repo).parent == tmp_path / "bundles"
        assert bundle_head(Path(git.repo)) == git.commit == commits[task.metadata["instance_id"]]
    # Three instances are too few to hold any out: eval sees the same ones, in a fixed order.
    assert {t.metadata["instance_id"] for t in tasks} == set(commits)
    evals = [source("eval", step, 3, 0) for step in (0, 7)]
    assert [t.metadata["instance_id"] for t in evals[0]] == [
        t.metadata["instance_id"] for t in evals[1]
    ]
    assert {t.metadata["instance_id"] for t in evals[0]} == set(commits)


def test_training_draws_are_seeded_per_step() -> None:
    source = task_source("swe")
    first = source("train", 3, 6, 1, runtime="docker")
    assert [t.model_dump() for t in first] == [
        t.model_dump() for t in source("train", 3, 6, 1, runtime="docker")
    ]
    assert first[0].runtime.image == "swebench/sweb.eval.x86_64." + (
        first[0].metadata["instance_id"].replace("__", "_1776_") + ":latest"
    )
    orders = {
        tuple(t.metadata["instance_id"] for t in source("train", s, 3, 1, runtime="docker"))
        for s in range(6)
    }
    assert len(orders) > 1


def test_a_file_of_instances_with_their_repos(tmp_path: Path) -> None:
    path = tmp_path / "gym.jsonl"
    path.write_text(json.dumps(GYM) + "\n")
    [task] = task_source("swe")(
        "train", 0, 1, instances=str(path), runtime="local", repos={"getmoto/moto": "/src/moto"}
    )
    assert task.runtime.kind == "local"
    assert task.runtime.source is not None and task.runtime.source.repo == "/src/moto"
    assert task.metadata["instance_id"] == GYM["instance_id"]


def test_bad_options_name_the_key() -> None:
    with pytest.raises(
        ConfigError, match=r"(?s)swe task source options.*image_namspace: unknown key"
    ):
        task_source("swe")("train", 0, 1, runtime="docker", image_namspace="x")


def test_splits_by_id_hash_are_disjoint_stable_and_near_the_fraction() -> None:
    pool = [SWEInstance(instance_id=f"org__repo-{n}", repo="org/repo") for n in range(1000)]
    train = split_instances(pool, "train", 0.1)
    held_out = split_instances(pool, "eval", 0.1)
    assert {i.instance_id for i in train}.isdisjoint(i.instance_id for i in held_out)
    assert len(train) + len(held_out) == 1000
    assert 60 < len(held_out) < 140
    assert split_instances(list(reversed(pool)), "eval", 0.1) == list(reversed(held_out))
    assert split_instances(pool, "eval", 0.0) == pool  # nothing held out: both see all


def test_a_training_config_names_the_source_and_its_options(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(
        "tasks:\n  source: swe\n  options:\n    runtime: bubblewrap\n    harness: pi\n"
    )
    loaded = TrainConfig.from_yaml(config)
    assert loaded.tasks.source == "swe"
    assert loaded.tasks.options == {"runtime": "bubblewrap", "harness": "pi"}
