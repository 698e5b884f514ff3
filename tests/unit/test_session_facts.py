"""A session's facts are typed fields of SessionResult, with one ``passed`` every reader uses;
``metadata`` keeps only the user's own keys, and results written before still read the same."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import polar
from polar.gateway.sessions import SessionTags
from polar.schemas.task import EvaluationSummary, SessionResult, SessionStatus
from polar.schemas.trajectory import (
    Trace,
    TraceStats,
    Trajectory,
    TrajectoryStats,
    TrajectoryStatus,
)

SRC = Path(polar.__file__).parent


def _result(status: SessionStatus, verdict: bool | None, reward: float | None) -> SessionResult:
    evaluation = None if verdict is None and reward is None else EvaluationSummary(verdict=verdict)
    return SessionResult(
        session_id="s1", task_id="t1", status=status, reward=reward, evaluation=evaluation
    )


@pytest.mark.parametrize(
    ("status", "verdict", "reward", "passed"),
    [
        (SessionStatus.COMPLETED, True, 1.0, True),
        (SessionStatus.COMPLETED, False, 1.0, False),  # the verdict wins over the score
        (SessionStatus.COMPLETED, None, 0.5, True),  # a score-only evaluator: reward > 0
        (SessionStatus.COMPLETED, None, 0.0, False),
        (SessionStatus.COMPLETED, None, None, False),  # never evaluated
        (SessionStatus.TIMEOUT, True, 1.0, False),  # a timed-out session never passed
        (SessionStatus.ERROR, True, 1.0, False),
    ],
)
def test_one_rule_decides_passed(
    status: SessionStatus, verdict: bool | None, reward: float | None, passed: bool
) -> None:
    assert _result(status, verdict, reward).passed is passed


def test_facts_written_into_metadata_before_are_read_into_fields() -> None:
    old = {
        "session_id": "s1",
        "task_id": "t1",
        "status": "COMPLETED",
        "reward": 1.0,
        "metadata": {
            "sample_index": 3,
            "session_dir": "/tmp/s1",
            "exit_code": 0,
            "passed": True,
            "evaluation": {"resolved": True},
            "mine": "kept",
        },
    }
    result = SessionResult.model_validate(old)
    assert (result.sample_index, result.session_dir, result.exit_code) == (3, "/tmp/s1", 0)
    assert result.evaluation == EvaluationSummary(verdict=True, details={"resolved": True})
    assert result.metadata == {"mine": "kept"} and result.passed
    again = SessionResult.model_validate_json(result.model_dump_json())
    assert again == result and "passed" not in json.loads(result.model_dump_json())["metadata"]


_FACTS = {"sample_index", "session_dir", "exit_code", "passed", "evaluation"}
_FACTS |= set(TraceStats.model_fields) | set(TrajectoryStats.model_fields)
# The readers of finished sessions (trainers, exporters, commands, the dashboard): they read
# SessionResult's fields and the traces' typed stats, never a metadata bag by string key.
_READERS = ("training", "generation", "quickstart", "trajectory", "rollout", "turn_rewards")


def _is_bag(node: ast.expr, aliases: set[str]) -> bool:
    """``x.metadata``, a name ``metadata`` / ``meta``, or a name bound to an expression that
    reads a ``.metadata`` (``meta = s.metadata if s else {}``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "metadata"
    return isinstance(node, ast.Name) and (node.id in ("metadata", "meta") or node.id in aliases)


def _string_keyed_reads(path: Path, keys: set[str], root: Path = SRC) -> list[str]:
    """``<bag>.get("key")`` and ``<bag>["key"]`` for a key in ``keys`` (see :func:`_is_bag`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(n, ast.Attribute) and n.attr == "metadata" for n in ast.walk(node.value))
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.expr):
            continue
        target, key = None, None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and node.args:
                target, key = node.func.value, node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            target, key = node.value, node.slice
        bag = target is not None and _is_bag(target, aliases)
        if bag and isinstance(key, ast.Constant) and key.value in keys:
            found.append(f"{path.relative_to(root)}:{node.lineno}: metadata[{key.value!r}]")
    return found


def test_no_reader_takes_a_session_fact_from_metadata() -> None:
    paths = [p for package in _READERS for p in sorted((SRC / package).rglob("*.py"))]
    found = [hit for path in paths for hit in _string_keyed_reads(path, _FACTS)]
    assert not found, found


def test_the_fact_checker_sees_a_read(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "a = r.metadata.get('passed', False)\nb = r.metadata['sample_index']\n"
        "c = r.metadata.get('mine')\n"
    )
    found = [h.split(": ")[1] for h in _string_keyed_reads(probe, _FACTS, tmp_path)]
    assert found == ["metadata['passed']", "metadata['sample_index']"]


# What the gateway knows of a live session: SessionTags' fields, and whether it is closed (the
# store's column). No module under gateway/ reads one from a bag by string key.
_SESSION_TAGS = set(SessionTags.model_fields) | {"closed"}


def test_no_gateway_module_reads_a_session_tag_by_string_key() -> None:
    paths = sorted((SRC / "gateway").rglob("*.py"))
    found = [hit for path in paths for hit in _string_keyed_reads(path, _SESSION_TAGS)]
    assert not found, found


def test_the_tag_checker_sees_each_way_the_gateway_read_them(tmp_path: Path) -> None:
    """The three reads the gateway made before SessionTags, planted in a probe."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "cap = self.metadata.get('max_model_calls')\n"
        "meta = session.metadata if session is not None else {}\nt = meta.get('task_id')\n"
        "for sid, metadata in store.sessions().items():\n    c = metadata.get('closed')\n"
        "body.get('harness')\n"
    )
    found = [h.split(": ")[1] for h in _string_keyed_reads(probe, _SESSION_TAGS, tmp_path)]
    assert found == ["metadata['max_model_calls']", "metadata['task_id']", "metadata['closed']"]


def test_stats_read_what_builders_wrote_with_one_set_of_defaults() -> None:
    trace = Trace(
        prompt_ids=[1],
        response_ids=[2, 3],
        loss_mask=[1, 1],
        metadata={"num_calls": 2, "call_spans": [[0, 1], [1, 2]], "mine": 1},
    )
    assert trace.stats.num_calls == 2 and trace.stats.call_spans == [(0, 1), (1, 2)]
    assert trace.stats.trainable and not trace.stats.aborted
    bare = Trajectory(status=TrajectoryStatus.COMPLETED, traces=[trace])
    assert bare.stats.num_calls == 0 and bare.stats.breaks == {}
    assert Trace(prompt_ids=[], response_ids=[], loss_mask=[]).stats.num_calls == 1
