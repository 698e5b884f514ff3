"""Task sources (held-out split, grading) and the training config / CLI surface."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polar.cli import train as train_cli
from polar.errors import ConfigError
from polar.training.tasks import arithmetic, task_source
from polar.training.trainer_config import TrainConfig


def pair(instruction: str) -> tuple[int, int]:
    a, b = map(int, re.findall(r"\d+", instruction))
    return a, b


def test_eval_split_never_overlaps_train() -> None:
    train = {pair(t.instruction) for step in range(30) for t in arithmetic("train", step, 8, 0)}
    held_tasks = arithmetic("eval", 0, 45, 0)
    held = {pair(t.instruction) for t in held_tasks}
    assert len(held) == 45  # distinct: every held-out pair once
    assert train and held and not train & held
    # the same eval tasks every time (before and after training compare like with like)
    assert [t.instruction for t in arithmetic("eval", 0, 8, 0)] == [
        t.instruction for t in arithmetic("eval", 0, 8, 0)
    ]


@pytest.mark.parametrize(
    ("reply", "passed"),
    [("7 + 13 = 20", True), ("The answer is 20.", True), ("20, no, 21", False), ("twenty", False)],
)
def test_grader_checks_the_last_number(tmp_path: Path, reply: str, passed: bool) -> None:
    [task] = arithmetic("train", 0, 1, 0, low=7, high=7)
    answer = task.metadata["answer"]
    (tmp_path / "answer.txt").write_text(
        reply.replace("20", str(answer)).replace("21", str(answer + 1))
    )
    command = task.evaluator.config["command"].replace("python3", sys.executable, 1)
    done = subprocess.run(command, shell=True, cwd=tmp_path, check=False)
    assert (done.returncode == 0) is passed


def test_task_source_by_import_path() -> None:
    assert task_source("arithmetic") is arithmetic
    assert task_source("polar.training.tasks:arithmetic") is arithmetic
    with pytest.raises(ConfigError, match="unknown task source"):
        task_source("nope")


def test_config_rejects_unknown_keys_with_their_location(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("steps: 3\noptim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"optim\.learning_rate: unknown key \(allowed here: lr"):
        TrainConfig.from_yaml(path)


def test_cli_parses_train_and_finds_bundled_configs() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    train_cli.add_parser(sub)
    args = parser.parse_args(["train", "arithmetic", "--steps", "3", "--no-resume"])
    assert args.func is train_cli.run_train and args.steps == 3 and args.no_resume
    assert "arithmetic" in train_cli.bundled_names()
    assert train_cli.load_config("arithmetic").tasks.source == "arithmetic"
