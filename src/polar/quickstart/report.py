"""The run's static HTML report: one self-contained file, no scripts, no network assets.

It shows what a trainer would receive: every trajectory turn by turn, with the tokens the
engine sampled (trainable, loss mask 1) highlighted and the tokens between turns (tool results,
template glue; mask 0) greyed, the reward of every sample, and where each session's time went.
Token text comes from the served model's tokenizer; without one, ids are shown as numbers.

This module only turns a run into plain view data; the markup and the style live in the
Jinja templates under ``templates/`` (autoescaped, so token text and tool output stay text).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from jinja2 import Environment, PackageLoader, StrictUndefined

from polar.quickstart.summary import STAGES, RunSummary
from polar.schemas.task import SessionResult
from polar.schemas.trajectory import Trace

# Tokens the model found unlikely (logprob below this) are marked, to make surprises visible.
SURPRISE_LOGPROB = -2.5
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
            r.metadata.get("sample_index", 0),
        ),
    )
    showcase = _showcase(ordered)
    template = _environment().get_template(TEMPLATE)
    page = template.render(
        summary=summary,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        showcase=_session(showcase, decoder) if showcase else None,
        rewards=_reward_grid(ordered),
        timing=_timing_rows(ordered),
        sessions=[_session(r, decoder) for r in ordered],
    )
    path.write_text(page)
    return path


class TokenText:
    """Token id to display text, cached; ``⟨id⟩`` without a tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self.tokenizer is None:
                text = f"⟨{token_id}⟩"
            else:
                text = str(self.tokenizer.decode([token_id]))
            self._cache[token_id] = text
        return text

    def join(self, ids: Iterable[int]) -> str:
        if self.tokenizer is None:
            return " ".join(self(i) for i in ids)
        return str(self.tokenizer.decode(list(ids)))


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


@dataclass(frozen=True)
class SampledToken:
    id: int
    text: str
    logprob: float | None


@dataclass(frozen=True)
class SampledTurn:
    sampled: ClassVar[bool] = True
    number: int
    tokens: list[SampledToken]
    mean_logprob: float | None


@dataclass(frozen=True)
class BetweenTurns:
    sampled: ClassVar[bool] = False
    size: int
    text: str


@dataclass(frozen=True)
class TraceView:
    index: int
    calls: object
    prompt_size: int
    response_size: int
    trainable: int
    finish_reason: str | None
    break_reason: object
    prompt_text: str
    turns: list[SampledTurn | BetweenTurns]


@dataclass(frozen=True)
class SessionView:
    anchor: str
    session_id: str
    task_id: str
    sample: object
    status: str
    reward: float | None
    calls: object
    drift: tuple[object, object] | None  # (turns, tokens), when the trajectory says
    breaks: object
    error: str | None
    traces: list[TraceView]


@cache
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("polar.quickstart", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals.update(stages=STAGES, stage_colors=STAGE_COLORS, surprise_logprob=SURPRISE_LOGPROB)
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
    return RewardCell(kind, label, r.error or r.status.value, _anchor(r))


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
                sample=r.metadata.get("sample_index", "?"),
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
            int(r.trajectory.metadata.get("num_calls", 0)) if r.trajectory else 0,
            r.reward or 0.0,
        ),
        default=None,
    )


def _session(r: SessionResult, decoder: TokenText) -> SessionView:
    trajectory = r.trajectory
    meta = trajectory.metadata if trajectory else {}
    return SessionView(
        anchor=_anchor(r),
        session_id=r.session_id,
        task_id=r.task_id,
        sample=r.metadata.get("sample_index", "?"),
        status=r.status.value,
        reward=r.reward,
        calls=meta.get("num_calls", 0),
        drift=(meta.get("drift_turns", 0), meta.get("drift_tokens", 0)) if meta else None,
        breaks=meta.get("breaks"),
        error=r.error[:300] if r.error else None,
        traces=[
            _trace(trace, index, decoder)
            for index, trace in enumerate(trajectory.traces if trajectory else [])
        ],
    )


def _trace(trace: Trace, index: int, decoder: TokenText) -> TraceView:
    turns: list[SampledTurn | BetweenTurns] = []
    sampled = 0
    for start, end, trainable in _runs(trace.loss_mask):
        ids = trace.response_ids[start:end]
        if trainable:
            sampled += 1
            logprobs = trace.response_logprobs[start:end] if trace.response_logprobs else None
            turns.append(_sampled_turn(sampled, ids, logprobs, decoder))
        else:
            turns.append(BetweenTurns(size=len(ids), text=decoder.join(ids)))
    return TraceView(
        index=index,
        calls=trace.metadata.get("num_calls", 1),
        prompt_size=len(trace.prompt_ids),
        response_size=len(trace.response_ids),
        trainable=sum(trace.loss_mask),
        finish_reason=trace.finish_reason,
        break_reason=trace.metadata.get("break_reason"),
        prompt_text=decoder.join(trace.prompt_ids),
        turns=turns,
    )


def _sampled_turn(
    number: int, ids: list[int], logprobs: list[float] | None, decoder: TokenText
) -> SampledTurn:
    tokens = [
        SampledToken(token_id, decoder(token_id), logprobs[i] if logprobs is not None else None)
        for i, token_id in enumerate(ids)
    ]
    mean = sum(logprobs) / len(logprobs) if logprobs else None
    return SampledTurn(number=number, tokens=tokens, mean_logprob=mean)


def _runs(mask: list[int]) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal mask values as (start, end, trainable)."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, mask[start] == 1))
            start = i
    return runs


def _anchor(r: SessionResult) -> str:
    return f"s-{r.session_id}"
