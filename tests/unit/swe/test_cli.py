"""``polar swe tasks`` writes TaskRequest YAMLs ``polar submit`` loads; ``polar swe list``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.cli.main import main
from polar.cli.rollout import load_task
from polar.swe.bundled import bundle_head, bundled_instances

from .records import GYM, VERIFIED


def test_bundled_tasks_point_at_bundles_written_beside_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tasks"
    assert main(["swe", "tasks", "--bundled", "--out", str(out), "--harness", "opencode"]) == 0
    assert "wrote 3 task(s)" in capsys.readouterr().out
    for instance in bundled_instances():
        task = load_task(out / f"{instance.instance_id}.yaml")
        assert task.instruction.endswith(instance.problem_statement.strip() + "\n</issue>\n")
        assert task.agent.harness == "opencode"
        assert task.evaluator.config["test_patch"] == instance.test_patch
        source = task.runtime.source
        assert source is not None and source.repo is not None
        assert Path(source.repo) == (out / "repos" / f"{instance.repo.split('/')[1]}.bundle")
        assert Path(source.repo).is_absolute()
        assert bundle_head(Path(source.repo)) == source.commit == instance.base_commit
    text = (out / "polar-bundled__textkit-1.yaml").read_text()
    assert "instruction: |" in text  # multi-line text stays readable


def test_instance_file_tasks_take_flags_over_an_options_file(tmp_path: Path) -> None:
    instances = tmp_path / "i.jsonl"
    instances.write_text(json.dumps(VERIFIED) + "\n" + json.dumps(GYM) + "\n")
    options = tmp_path / "options.yaml"
    options.write_text("runtime: docker\nretries: 3\nimage_tag: v1\n")
    out = tmp_path / "out"
    args = ["swe", "tasks", str(instances), "--out", str(out), "--options", str(options)]
    assert main([*args, "--image-tag", "v2", "--num-samples", "8"]) == 0
    task = load_task(out / "getmoto__moto-5752.yaml")
    assert task.runtime.image == "swebench/sweb.eval.x86_64.getmoto_1776_moto-5752:v2"
    assert task.evaluator.config["retries"] == 3 and task.num_samples == 8
    assert not (out / "repos").exists()


def test_local_tasks_take_repos_and_say_which_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    instances = tmp_path / "i.jsonl"
    instances.write_text(json.dumps(VERIFIED) + "\n" + json.dumps(GYM) + "\n")
    out = tmp_path / "out"
    args = ["swe", "tasks", str(instances), "--out", str(out), "--runtime", "local"]
    assert main([*args, "--repos", "astropy/astropy=/src/astropy"]) == 2
    assert "no local repository for getmoto/moto" in capsys.readouterr().err
    assert main([*args, "--repo", "astropy/astropy=/a", "--repo", "getmoto/moto=/m"]) == 0
    task = load_task(out / "getmoto__moto-5752.yaml")
    assert task.runtime.source is not None and task.runtime.source.repo == "/m"


def test_list_prints_ids_repos_and_test_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    instances = tmp_path / "i.jsonl"
    instances.write_text(json.dumps(VERIFIED) + "\n")
    assert main(["swe", "list", str(instances)]) == 0
    out = capsys.readouterr().out
    assert "astropy__astropy-12907" in out and "astropy/astropy" in out
    assert main(["swe", "list", "--bundled"]) == 0
    out = capsys.readouterr().out
    assert "3 instance(s)" in out and "polar-bundled/shopcart" in out


def test_one_source_must_be_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["swe", "list"]) == 2
    assert "or pass --bundled" in capsys.readouterr().err
