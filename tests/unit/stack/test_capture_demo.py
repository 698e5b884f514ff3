"""The capture demo's gateway (``polar demo``) reports a capture that differs from the engine's
reply: the faithful run itself is tests/integration/test_demo.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from polar.cli.main import main
from polar.engines.scripted import logged_tokens
from polar.stack import capture_demo
from polar.stack.capture_demo import DemoGateway


def test_a_sampled_id_the_record_lacks_fails_every_call_and_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def one_more_sampled(reply: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
        prompt_ids, sampled_ids, logprobs = logged_tokens(reply)
        return prompt_ids, [*sampled_ids, 0], logprobs

    monkeypatch.setattr(capture_demo, "logged_tokens", one_more_sampled)
    assert main(["demo", "--out", str(tmp_path)]) == 1
    assert "capture mismatch" in capsys.readouterr().out
    records = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(records) == 4 * 2 * 2  # providers x (stream, not) x two turns, written anyway


def test_the_gateway_serves_from_entry_and_closes_its_store_on_exit(tmp_path: Path) -> None:
    with DemoGateway(tmp_path) as gateway:
        calls = gateway.converse()
        assert gateway.url.startswith("http://127.0.0.1:")
    assert [(c.provider, c.stream, c.turn) for c in calls][:2] == [
        ("openai_chat", False, 1),
        ("openai_chat", False, 2),
    ]
    assert all(c.faithful for c in calls) and {c.finish_reason for c in calls} == {
        "tool_calls",
        "stop",
    }
    first = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert first["sampled_ids"] and gateway.capture_db == tmp_path / "captures.db"
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        gateway.store.records(first["session_id"])
