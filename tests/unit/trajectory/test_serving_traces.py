"""``polar capture export``: a capture store as an agentic replay trace and a GRPO rollout trace,
checked back against the store (lengths, gaps, prefix hashes, sub-agent markers)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.cli.main import main
from polar.trajectory.serving_traces.agentic_replay import BlockHashes
from polar.trajectory.serving_traces.base import ServingTrace
from polar.trajectory.serving_traces.registry import serving_traces

T0 = 1_700_000_000.0
SYSTEM = list(range(1000, 1600))  # 600 tokens: one whole 512-token block and a partial one
SUBAGENT = "You are an agent for Claude Code, Anthropic's CLI."


def call(
    session: str,
    n: int,
    prompt: list[int],
    sampled: list[int],
    start: float,
    end: float,
    **fields: Any,
) -> CaptureRecord:
    return CaptureRecord(
        completion_id=f"cmpl-{session}-{n}",
        session_id=session,
        provider="openai_chat",
        model="m",
        engine="scripted",
        started_at=T0 + start,
        finished_at=T0 + end,
        upstream_request={"model": "m", "messages": fields.pop("messages", [])},
        response={"role": "assistant", "content": "ok"},
        prompt_ids=prompt,
        sampled_ids=sampled,
        logprobs=None,
        finish_reason="stop",
        **fields,
    )


def build_store(path: Path) -> None:
    """Two samples of task t: a main agent with a tool turn, a sub-agent and a side call; and
    a second sample opening with the same prompt."""
    user = [*SYSTEM, 7, 8, 99, 3]
    reply = [10, 11, 99]
    tool = [6, 40, 41, 42, 3]
    calls = [
        call("ps-a", 0, user, reply, 0.0, 1.25, messages=[{"role": "user", "content": "fix"}]),
        call(
            "ps-a",
            1,
            [*SYSTEM, 9, 99, 3],
            [50, 99],
            1.5,
            2.0,
            messages=[{"role": "system", "content": SUBAGENT}, {"role": "user", "content": "go"}],
        ),
        call("ps-a", 2, [*user, *reply, *tool], [12, 99], 2.75, 4.0),
        call("ps-a", 3, [1, 2, 3], [70, 99], 3.5, 3.6, tags=["side_call:title"]),
        call("ps-b", 0, user, [20, 99], 0.5, 2.0),
    ]

    async def write() -> None:
        store = CaptureStore(path)
        try:
            await store.add_session("ps-a", {"task_id": "t", "sample_index": 0})
            await store.add_session("ps-b", {"task_id": "t", "sample_index": 1})
            for record in calls:
                await store.append(record)
        finally:
            store.close()

    asyncio.run(write())


def export(tmp_path: Path, fmt: str, *extra: str) -> list[dict[str, Any]]:
    db, out = tmp_path / "c.db", tmp_path / f"{fmt}.jsonl"
    if not db.exists():
        build_store(db)
    assert main(["capture", "export", str(db), "--format", fmt, "-o", str(out), *extra]) == 0
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def stored(tmp_path: Path) -> dict[str, list[CaptureRecord]]:
    store = CaptureStore(tmp_path / "c.db")
    try:
        return {sid: store.records(sid) for sid in store.session_ids()}
    finally:
        store.close()


def test_agentic_replay_lengths_gaps_and_times_agree_with_the_store(tmp_path: Path) -> None:
    rows = export(tmp_path, "agentic_replay")
    records = stored(tmp_path)
    assert [r["session_id"] for r in rows] == ["ps-a"] * 4 + ["ps-b"]
    origin = min(r.started_at for rs in records.values() for r in rs)
    for sid, recs in records.items():
        mine = [r for r in rows if r["session_id"] == sid]
        assert [r["turn"] for r in mine] == list(range(len(recs)))
        for k, (row, rec) in enumerate(zip(mine, recs, strict=True)):
            assert row["request_id"] == rec.completion_id
            assert row["input_length"] == len(rec.prompt_ids)
            assert row["output_length"] == len(rec.sampled_ids)
            assert row["timestamp"] == round((rec.started_at - origin) * 1000)
            gap = rec.started_at - recs[k - 1].finished_at if k else 0.0
            assert row["delay"] == max(0, round(gap * 1000))
            assert len(row["hash_ids"]) == math.ceil(len(rec.prompt_ids) / 512)
    a = [r for r in rows if r["session_id"] == "ps-a"]
    assert [r["delay"] for r in a] == [0, 250, 750, 0]  # the side call overlapped: 0, not < 0
    assert [r["timestamp"] for r in rows] == [0, 1500, 2750, 3500, 500]


def test_agentic_replay_hashes_share_exactly_the_shared_prefix_blocks(tmp_path: Path) -> None:
    rows = export(tmp_path, "agentic_replay")
    first, sub, tool_turn, _side, other = rows
    assert first["hash_ids"] == other["hash_ids"]  # the same prompt in another session
    # The sub-agent shares SYSTEM's first 512 tokens, then differs inside the second block.
    assert sub["hash_ids"][0] == first["hash_ids"][0] and sub["hash_ids"][1] != first["hash_ids"][1]
    # The tool turn extends the first prompt: its first block is shared; the second (partial
    # in the first prompt) now holds more tokens, so it and everything after is new.
    assert tool_turn["hash_ids"][0] == first["hash_ids"][0]
    assert tool_turn["hash_ids"][1] not in first["hash_ids"]
    # Ids are numbered from 0 in order of first appearance, chained: same id, same prefix.
    seen = [h for r in rows for h in r["hash_ids"]]
    assert sorted(set(seen)) == list(range(len(set(seen))))
    # Chained: an equal block after a different one is a different block.
    hashes = BlockHashes(4)
    assert hashes([1, 1, 1, 1, 2, 2]) == [0, 1]
    assert hashes([3, 3, 3, 3, 2, 2]) == [2, 3]
    assert hashes([1, 1, 1, 1, 2, 2, 5]) == [0, 4]


def test_agentic_replay_marks_sub_agents_and_side_calls(tmp_path: Path) -> None:
    rows = export(tmp_path, "agentic_replay")
    assert [r["agent"] for r in rows] == ["main", "subagent", "main", "side_call:title", "main"]
    assert [r["parent_turn"] for r in rows] == [None, 0, 0, None, None]


def test_block_size_is_an_option(tmp_path: Path) -> None:
    rows = export(tmp_path, "agentic_replay", "--block-size", "100")
    assert [len(r["hash_ids"]) for r in rows] == [7, 7, 7, 1, 7]


def test_grpo_rollout_rows_agree_with_the_store(tmp_path: Path) -> None:
    rows = export(tmp_path, "grpo_rollout")
    records = stored(tmp_path)
    assert [(r["group_id"], r["sample_index"], r["session_id"]) for r in rows] == [
        ("t", 0, "ps-a"),
        ("t", 1, "ps-b"),
    ]
    for row in rows:
        recs = records[row["session_id"]]
        assert row["num_turns"] == len(recs)
        assert row["prompt_length"] == len(recs[0].prompt_ids)
        assert row["output_lengths"] == [len(r.sampled_ids) for r in recs]
        assert row["generation_times_ms"] == [
            round((r.finished_at - r.started_at) * 1000) for r in recs
        ]
        assert len(row["observation_lengths"]) == len(row["tool_times_ms"]) == len(recs) - 1
    _main_1, sub, _tool_turn, side = records["ps-a"]
    # Each turn is measured from the reply it follows: the sub-agent's first call and the main
    # agent's tool turn both follow the first reply; the side call, the one just before it.
    assert rows[0]["observation_lengths"] == [
        len(sub.prompt_ids) - len(SYSTEM),  # the sub-agent shares the system prompt only
        5,  # the tool result and the generation prompt: exactly what the harness added
        len(side.prompt_ids),
    ]
    assert rows[0]["tool_times_ms"] == [250, 1500, -500]  # the side call overlapped turn 2
    assert rows[1]["observation_lengths"] == rows[1]["tool_times_ms"] == []


def test_observation_length_of_an_extending_call_is_what_the_harness_added() -> None:
    from polar.trajectory.serving_traces.base import observation_length

    first = call("s", 0, [1, 2, 3], [10, 99], 0.0, 1.0)
    second = call("s", 1, [1, 2, 3, 10, 99, 6, 7, 3], [11, 99], 2.0, 3.0)
    assert observation_length(first, second) == 3


def test_a_format_is_one_class_and_one_registry_line(tmp_path: Path) -> None:
    class Calls(ServingTrace):
        name = "calls"

        def rows(self, sessions, origin):
            for session in sessions:
                yield {"session_id": session.session_id, "calls": len(session.records)}

    serving_traces.add("calls", Calls)
    try:
        assert export(tmp_path, "calls") == [
            {"session_id": "ps-a", "calls": 4},
            {"session_id": "ps-b", "calls": 1},
        ]
    finally:
        serving_traces.remove("calls")


def test_unknown_format_and_missing_store_are_errors(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "x.jsonl")
    assert main(["capture", "export", str(tmp_path / "none.db"), "-o", out]) == 2
    assert "no capture store" in capsys.readouterr().err
    build_store(tmp_path / "c.db")
    code = main(["capture", "export", str(tmp_path / "c.db"), "--format", "nope", "-o", out])
    assert code == 2 and "unknown serving trace 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["agentic_replay", "grpo_rollout"])
def test_one_session_only(tmp_path: Path, fmt: str) -> None:
    rows = export(tmp_path, fmt, "--session", "ps-b")
    assert {r["session_id"] for r in rows} == {"ps-b"}
