"""Dataset rows: accepted attempts only, both forms of each trace, and Parquet that agrees."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from polar.generation.attempts import Ledger, Spend, attempt_record, read_ledger
from polar.generation.dataset import write_dataset
from polar.schemas.task import SessionResult, SessionStatus

from .results import result


def ledger_with(tmp_path: Path, items: list[tuple[str, int, SessionResult]]) -> Ledger:
    ledger = Ledger(tmp_path)
    for instance, attempt, res in items:
        stored = ledger.store_result(instance, attempt, res)
        ledger.append(
            attempt_record(
                res,
                instance_id=instance,
                attempt=attempt,
                repo=f"o/{instance[0]}",
                run=1,
                stored=stored,
                spend=Spend(),
            )
        )
    return ledger


def test_rows_are_the_accepted_attempts_in_both_forms(tmp_path: Path) -> None:
    ledger = ledger_with(
        tmp_path,
        [
            ("b1", 1, result(session_id="s3", seed=30, traces=2)),
            ("a1", 0, result(session_id="s1", seed=10)),
            ("a1", 1, result(session_id="s2", passed=False)),
            ("b1", 0, result(session_id="s4", status=SessionStatus.TIMEOUT)),
        ],
    )
    files = write_dataset(tmp_path, read_ledger(ledger.path).values(), ledger.load_result)
    rows = [json.loads(line) for line in files.jsonl.read_text().splitlines()]
    assert [(r["instance_id"], r["attempt"], r["trace_index"]) for r in rows] == [
        ("a1", 0, 0),
        ("b1", 1, 0),
        ("b1", 1, 1),
    ]
    assert (files.rows, files.attempts) == (3, 2)
    first = rows[0]
    assert first["repo"] == "o/a" and first["session_id"] == "s1" and first["resolved"] is True
    assert first["model_patch"].startswith("diff --git")
    assert first["reward"] == 1.0
    # Chat form: the prompt and response messages, tool calls included, and the tools.
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert first["messages"][1]["tool_calls"][0]["function"]["name"] == "shell"
    assert first["tools"][0]["function"]["name"] == "shell"
    # Token form: prompt then response ids, loss on sampled response tokens only.
    assert first["input_ids"] == [10, 11, 12, 20, 21, 22, 23]
    assert first["assistant_masks"] == [0, 0, 0, 1, 1, 0, 1]
    assert first["prompt_length"] == 3 and first["num_prompt_messages"] == 1
    assert files.trainable_tokens == 9
    assert files.parquet is not None
    table = pq.read_table(files.parquet).to_pylist()
    assert [(r["instance_id"], r["attempt"], r["trace_index"]) for r in table] == [
        (r["instance_id"], r["attempt"], r["trace_index"]) for r in rows
    ]
    assert table[0]["input_ids"] == first["input_ids"]
    assert table[0]["assistant_masks"] == first["assistant_masks"]
    assert json.loads(table[0]["messages"]) == first["messages"]


def test_rebuilding_gives_the_same_bytes(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, [("a1", 0, result(seed=10)), ("a2", 0, result(seed=20))])
    first = write_dataset(tmp_path, read_ledger(ledger.path).values(), ledger.load_result)
    before = first.jsonl.read_bytes()
    records = list(reversed(list(read_ledger(ledger.path).values())))
    write_dataset(tmp_path, records, ledger.load_result)
    assert first.jsonl.read_bytes() == before


def test_no_accepted_attempts_is_an_empty_dataset(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, [("a1", 0, result(passed=False))])
    files = write_dataset(tmp_path, read_ledger(ledger.path).values(), ledger.load_result)
    assert files.jsonl.read_text() == "" and files.rows == 0
    assert files.parquet is not None and pq.read_table(files.parquet).num_rows == 0
