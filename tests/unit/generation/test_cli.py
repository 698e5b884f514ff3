"""``polar generate``'s arguments become the run's options; the run itself is stubbed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from polar.cli import generate as generate_cli
from polar.cli.main import main
from polar.generation.acceptance import acceptance
from polar.generation.dataset import DatasetFiles
from polar.generation.options import GenerateOptions
from polar.generation.run import GenerateRun


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[GenerateOptions]:
    seen: list[GenerateOptions] = []

    def fake_run(options: GenerateOptions, console: Console) -> GenerateRun:
        seen.append(options)
        return GenerateRun(
            out_dir=tmp_path,
            report=acceptance([]),
            dataset=DatasetFiles(tmp_path / "dataset.jsonl", None, 0, 0, 0),
            acceptance_json=tmp_path / "acceptance.json",
            acceptance_md=tmp_path / "acceptance.md",
            ledger=tmp_path / "attempts.jsonl",
            run=None,
            submitted=0,
            recorded=[],
            interrupted=False,
        )

    monkeypatch.setattr(generate_cli, "run_generate", fake_run)
    return seen


def test_arguments_become_options(asked: list[GenerateOptions], capsys: Any) -> None:
    code = main(
        [
            "generate", "swe-gym.jsonl", "--engine-url", "http://127.0.0.1:1", "--attempts", "3",
            "--concurrency", "8", "--instances", "a__b-1, c__d-2", "--limit", "5",
            "--repo", "o/r=/repos/r", "--test-timeout", "60", "--image-registry", "reg:5000",
            "--harness", "agent", "--retry-errors",
        ]
    )  # fmt: skip
    assert code == 0
    (options,) = asked
    assert options.instances == "swe-gym.jsonl" and not options.bundled
    assert options.out == Path("polar-runs/generate-swe-gym")
    assert (options.attempts, options.concurrency, options.limit) == (3, 8, 5)
    assert options.only == ("a__b-1", "c__d-2")
    assert options.retry_errors and options.harness == "agent"
    assert options.task_options == {
        "repos": {"o/r": "/repos/r"},
        "test_timeout_s": 60.0,
        "image_registry": "reg:5000",
    }
    assert "nothing to run" in capsys.readouterr().out


def test_bundled_defaults(asked: list[GenerateOptions]) -> None:
    assert main(["generate", "--bundled", "--engine-url", "http://x", "--out", "d"]) == 0
    (options,) = asked
    assert options.bundled and options.out == Path("d") and options.task_options == {}


def test_instances_or_bundled_exactly(asked: list[GenerateOptions], capsys: Any) -> None:
    assert main(["generate", "--engine-url", "http://x"]) == 2
    assert main(["generate", "f.jsonl", "--bundled", "--engine-url", "http://x"]) == 2
    assert "an instance file or --bundled" in capsys.readouterr().err
    assert asked == []


def test_a_bad_repo_mapping_is_a_usage_error(asked: list[GenerateOptions]) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--bundled", "--repo", "no-path-given"])
