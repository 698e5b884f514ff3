"""``polar quickstart --trained``: the newest finished checkpoint of the tool_use recipe."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from polar.cli import quickstart as cli
from polar.cli.train import load_config


def test_the_default_is_where_the_bundled_tool_use_recipe_writes() -> None:
    assert load_config("tool_use").output_dir == Path(cli.TOOL_USE_OUTPUT)


def test_the_newest_finished_checkpoint_is_served(tmp_path: Path) -> None:
    for step, finished in ((2, True), (4, True), (6, False)):  # step 6 crashed mid-save
        target = tmp_path / "checkpoints" / f"step-{step:06d}"
        target.mkdir(parents=True)
        if finished:
            (target / "trainer_state.json").write_text("{}")
    assert cli.trained_model(tmp_path) == tmp_path / "checkpoints" / "step-000004"
    assert cli.trained_model(tmp_path / "nothing-here") is None


def test_without_a_checkpoint_it_says_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["quickstart", "--trained", str(tmp_path)])
    assert args.func(args) == 2
    assert "polar train tool_use" in capsys.readouterr().err
