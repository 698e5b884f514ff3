"""The run's static HTML report: one self-contained file, no scripts, no network assets.

It shows what a trainer would receive: every trajectory turn by turn (the view of
:mod:`polar.trajectory.html`, which the rollout server's dashboard shows too), the reward of
every sample, and where each session's time went.

This module only turns a run into plain view data; the markup and the style live in the
Jinja templates under ``templates/`` (autoescaped, so token text and tool output stay text).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader

from polar.quickstart.summary import STAGES, RunSummary
from polar.schemas.task import SessionResult
from polar.trajectory.html import TokenText, anchor, environment, session_view

STAGE_COLORS = {
    "queued": "#c9ced6",
    "init": "#7fb3d5",
    "ready_wait": "#d6e9f5",
    "run": "#2e86c1",
    "postrun_wait": "#e5e7e9",
    "postrun": "#a569bd",
}
TEMPLATE = "report.html.jinja"


def write_report(
    path: Path,
    summary: RunSummary,
    results: list[SessionResult],
    *,
    tokenizer: Any = None,
) -> Path:
    """Write the report for a finished run to ``path``."""
    decoder = TokenText(tokenizer)
    task_order = {task_id: i for i, task_id in enumerate(summary.tasks)}
    ordered = sorted(
        results,
        key=lambda r: (
            task_order.get(r.task_id, len(task_order)),
            r.sample_index or 0,
        ),
    )
    showcase = _showcase(ordered)
    template = _environment().get_template(TEMPLATE)
    page = template.render(
        summary=summary,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        showcase=session_view(showcase, decoder) if showcase else None,
        rewards=_reward_grid(ordered),
        timing=_timing_rows(ordered),
        sessions=[session_view(r, decoder) for r in ordered],
    )
    path.write_text(page)
    return path


@dataclass(frozen=True)
class RewardCell:
    kind: str  # pass, fail, or bad (no reward: the session failed before it was scored)
    label: str
    title: str
    anchor: str


@dataclass(frozen=True)
class RewardRow:
    task_id: str
    cells: list[RewardCell]
    mean: float | None


@dataclass(frozen=True)
class RewardGrid:
    samples: int  # columns: the most samples any task has
    rows: list[RewardRow]


@dataclass(frozen=True)
class BarPart:
    stage: str
    seconds: float
    share: float  # percent of the longest session's time


@dataclass(frozen=True)
class TimingRow:
    task_id: str
    sample: object
    total: float
    parts: list[BarPart]


@cache
def _environment() -> Environment:
    env = environment(PackageLoader("polar.quickstart", "templates"))
    env.globals.update(stages=STAGES, stage_colors=STAGE_COLORS)
    return env


def _reward_grid(results: list[SessionResult]) -> RewardGrid:
    by_task: dict[str, list[SessionResult]] = {}
    for r in results:
        by_task.setdefault(r.task_id, []).append(r)
    rows = []
    for task_id, rs in by_task.items():
        rewards = [r.reward for r in rs if r.reward is not None]
        mean = sum(rewards) / len(rewards) if rewards else None
        rows.append(RewardRow(task_id, [_reward_cell(r) for r in rs], mean))
    return RewardGrid(max((len(rs) for rs in by_task.values()), default=0), rows)


def _reward_cell(r: SessionResult) -> RewardCell:
    if r.reward is None:
        kind, label = "bad", r.status.value.lower()
    else:
        kind, label = ("pass" if r.reward > 0 else "fail"), f"{r.reward:g}"
    return RewardCell(kind, label, r.error or r.status.value, anchor(r))


def _timing_rows(results: list[SessionResult]) -> list[TimingRow]:
    """One bar per session, scaled to the longest session."""
    longest = max((sum(r.timing.get(s, 0.0) for s in STAGES) for r in results), default=0.0)
    rows = []
    for r in results:
        parts = [
            BarPart(stage, seconds, 100 * seconds / longest)
            for stage in STAGES
            if longest and (seconds := r.timing.get(stage, 0.0)) > 0
        ]
        rows.append(
            TimingRow(
                task_id=r.task_id,
                sample="?" if r.sample_index is None else r.sample_index,
                total=r.timing.get("total", 0),
                parts=parts,
            )
        )
    return rows


def _showcase(results: list[SessionResult]) -> SessionResult | None:
    """The session shown first: the most calls merged (the richest picture), then reward."""
    with_traces = [r for r in results if r.trajectory is not None and r.trajectory.traces]
    return max(
        with_traces,
        key=lambda r: (
            r.trajectory.stats.num_calls if r.trajectory else 0,
            r.reward or 0.0,
        ),
        default=None,
    )
