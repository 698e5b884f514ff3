"""The numbers a run ends with, computed from what it wrote, and the table that shows them.

Every figure comes from the run directory's own records (session results, trajectories,
captured calls), so the table, ``summary.json`` and the files can never disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any

from rich import box
from rich.table import Table

from polar.schemas.task import SessionResult, SessionStatus
from polar.schemas.token_delivery import TokenDelivery

STAGES = ("queued", "init", "ready_wait", "run", "postrun_wait", "postrun")


@dataclass(frozen=True)
class Counts:
    """Sessions, outcomes, calls and trajectory shape for one task or the whole run."""

    sessions: int
    completed: int
    timeout: int
    error: int
    calls: int
    traces: int
    calls_in_traces: int
    drift_turns: int
    drift_tokens: int
    breaks: int
    trainable_tokens: int
    merged_calls: int = 0
    context_exact_calls: int = 0
    splits: dict[str, int] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    passed: int = 0
    delivery: TokenDelivery = field(default_factory=TokenDelivery)

    @property
    def merge_ratio(self) -> float | None:
        """Model calls per trace: how many calls prefix merging joined into each trace."""
        return self.calls_in_traces / self.traces if self.traces else None

    @property
    def mean_reward(self) -> float | None:
        """Over the sessions that were scored (one that errored before evaluation is not)."""
        return fmean(self.rewards) if self.rewards else None

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "merge_ratio": self.merge_ratio,
            "mean_reward": self.mean_reward,
            "delivery": self.delivery.model_dump(mode="json")
            | {"fraction": self.delivery.fraction},
        }


@dataclass(frozen=True)
class RunSummary:
    tasks: dict[str, Counts]
    total: Counts
    wall_s: float
    stage_mean_s: dict[str, float]
    facts: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "facts": self.facts,
            "wall_s": self.wall_s,
            "total": self.total.as_dict(),
            "tasks": {task_id: c.as_dict() for task_id, c in self.tasks.items()},
            "stage_mean_s": self.stage_mean_s,
        }


def summarize(
    results: Iterable[SessionResult],
    calls: Mapping[str, int],
    *,
    wall_s: float,
    facts: Mapping[str, Any] | None = None,
) -> RunSummary:
    """The summary of ``results``; ``calls`` is the number of captured calls per session."""
    results = list(results)
    by_task: dict[str, list[SessionResult]] = {}
    for result in results:
        by_task.setdefault(result.task_id, []).append(result)
    stage_mean = {
        stage: round(fmean(r.timing.get(stage, 0.0) for r in results), 3) if results else 0.0
        for stage in (*STAGES, "total")
    }
    return RunSummary(
        tasks={task_id: _counts(rs, calls) for task_id, rs in by_task.items()},
        total=_counts(results, calls),
        wall_s=round(wall_s, 1),
        stage_mean_s=stage_mean,
        facts=dict(facts or {}),
    )


def _counts(results: list[SessionResult], calls: Mapping[str, int]) -> Counts:
    def status(s: SessionStatus) -> int:
        return sum(1 for r in results if r.status == s)

    trajectories = [r.trajectory for r in results if r.trajectory is not None]
    traces = [t for tr in trajectories for t in tr.traces]
    stats = [tr.stats for tr in trajectories]
    return Counts(
        sessions=len(results),
        completed=status(SessionStatus.COMPLETED),
        timeout=status(SessionStatus.TIMEOUT),
        error=status(SessionStatus.ERROR),
        calls=sum(calls.get(r.session_id, 0) for r in results),
        traces=len(traces),
        calls_in_traces=sum(s.calls_in_traces for s in stats),
        drift_turns=sum(s.drift_turns for s in stats),
        drift_tokens=sum(s.drift_tokens for s in stats),
        breaks=sum(sum(s.breaks.values()) for s in stats),
        trainable_tokens=sum(sum(t.loss_mask) for t in traces),
        merged_calls=sum(s.merged_calls for s in stats),
        context_exact_calls=sum(s.context_exact_calls for s in stats),
        splits=dict(sum((Counter(s.breaks) for s in stats), Counter())),
        rewards=[r.reward for r in results if r.reward is not None],
        passed=sum(1 for r in results if r.passed),
        delivery=TokenDelivery.total(r.delivery for r in results),
    )


def summary_table(summary: RunSummary) -> Table:
    """One row per task and a total row; the run's facts go in the caption."""
    table = Table(title="Polar quickstart", box=box.SIMPLE_HEAVY, caption=_caption(summary))
    table.add_column("task")
    for name in ("sessions", "ok", "timeout", "error", "calls", "traces", "merge", "exact"):
        table.add_column(name, justify="right")
    table.add_column("delivered", justify="right")
    table.add_column("reward", justify="right")
    for task_id, counts in summary.tasks.items():
        table.add_row(task_id, *_cells(counts))
    table.add_section()
    table.add_row("all", *_cells(summary.total), style="bold")
    return table


def _cells(c: Counts) -> list[str]:
    merge = f"{c.merge_ratio:.2f}" if c.merge_ratio is not None else "-"
    reward = f"{c.mean_reward:.2f}" if c.mean_reward is not None else "-"
    delivered = f"{c.delivery.fraction:.0%}" if c.delivery.fraction is not None else "-"
    return [
        str(c.sessions),
        str(c.completed),
        str(c.timeout),
        str(c.error),
        str(c.calls),
        str(c.traces),
        merge,
        f"{c.context_exact_calls}/{c.merged_calls}",
        delivered,
        f"{reward} ({c.passed}/{c.sessions})",
    ]


def _caption(summary: RunSummary) -> str:
    facts = summary.facts
    parts = [
        f"wall time {summary.wall_s:.0f} s",
        f"{facts.get('harness', '?')} in {facts.get('runtime', '?')}",
        f"{facts.get('engine', '?')} {facts.get('model') or ''}".strip(),
        f"{summary.total.trainable_tokens} trainable tokens",
        summary.total.delivery.describe(),
    ]
    messages = facts.get("user_messages")
    if messages and messages > 1:  # say what made sessions several calls long
        parts.append(f"{messages:g} user messages per session (the suite's follow-ups)")
    if facts.get("interrupted"):
        parts.append("interrupted (Ctrl-C)")
    return " · ".join(parts)
