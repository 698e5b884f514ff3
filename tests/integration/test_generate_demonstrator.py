"""``polar generate --demonstrator``: a newcomer's accepted dataset in seconds, no model needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.cli.main import main
from polar.stack.demonstrator import MODEL_NAME

pytestmark = pytest.mark.slow


def test_the_demonstrator_fills_the_dataset_through_a_real_harness_loop(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    argv = ["generate", "--bundled", "--demonstrator", "--harness", "agent", "--out", str(out)]
    assert main(argv) == 0

    report = json.loads((out / "acceptance.json").read_text())
    assert report["total"]["attempts"] == 3 and report["total"]["accepted"] == 3
    assert report["facts"]["models"] == [MODEL_NAME]
    rows = [json.loads(line) for line in (out / "dataset.jsonl").read_text().splitlines()]
    assert sorted(r["instance_id"] for r in rows) == [
        "polar-bundled__ledger-1",
        "polar-bundled__shopcart-1",
        "polar-bundled__textkit-1",
    ]
    for row in rows:
        # Two sampled turns (the git apply call, the summary) and the tool's real output between.
        calls = [m for m in row["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
        assert len(calls) == 1 and "git apply" in calls[0]["tool_calls"][0]["function"]["arguments"]
        assert any(
            m["role"] == "tool" and "1 file changed" in m["content"] for m in row["messages"]
        )
        assert len(row["input_ids"]) == len(row["assistant_masks"])
        assert 0 < sum(row["assistant_masks"]) < len(row["input_ids"])
        assert row["model_patch"].startswith("diff --git")
