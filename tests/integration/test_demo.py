"""``polar demo``: every provider, streamed and not, captured token-faithfully (it broke once
when gateway-side rendering changed the engine replies it compares against)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.cli.main import main

pytestmark = pytest.mark.slow


def test_demo_reports_every_capture_faithful(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--out", str(tmp_path)]) == 0
    assert "all captures token-faithful" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 * 2 * 2  # providers x (stream, not) x two turns
    assert all(r["sampled_ids"] and r["prompt_ids"] for r in records)
