"""The run's static HTML report: one self-contained file, no scripts, no network assets.

It shows what a trainer would receive: every trajectory turn by turn, with the tokens the
engine sampled (trainable, loss mask 1) highlighted and the tokens between turns (tool results,
template glue; mask 0) greyed, the reward of every sample, and where each session's time went.
Token text comes from the served model's tokenizer; without one, ids are shown as numbers.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from polar.quickstart.summary import STAGES, Counts, RunSummary
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

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1c2833;
background:#f7f9fb}
main{max-width:1180px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 10px;border-bottom:1px solid #dde3e8;
padding-bottom:4px}
.facts{color:#566573}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:16px}
.card{background:#fff;border:1px solid #dde3e8;border-radius:8px;padding:10px 14px;min-width:108px}
.card b{display:block;font-size:20px}.card span{color:#566573;font-size:12px}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #dde3e8;padding:4px 8px;text-align:right}th{background:#eef2f5}
td:first-child,th:first-child{text-align:left}
.cell{display:inline-block;min-width:30px;text-align:center;border-radius:5px;padding:2px 6px;
color:#fff;text-decoration:none}
.pass{background:#1e8449}.fail{background:#909497}.bad{background:#c0392b}
.bars{background:#fff;border:1px solid #dde3e8;border-radius:8px;padding:10px 14px}
.bar-row{display:flex;align-items:center;margin:3px 0}.bar-label{width:230px;font-size:12px;
color:#566573;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.bar{display:flex;height:14px;flex:1}.bar div{height:14px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
details.session{background:#fff;border:1px solid #dde3e8;border-radius:8px;margin:10px 0;
padding:8px 14px}
details.session>summary{cursor:pointer;font-weight:600}
.meta{color:#566573;font-size:12px;margin:6px 0}
.turn{margin:10px 0;border-left:4px solid #2e86c1;padding:2px 10px}
.inter{border-left-color:#c9ced6}
.turn h4{margin:0 0 4px;font-size:12px;color:#566573;font-weight:600}
.tokens{font:12.5px/1.6 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;
word-break:break-word}
.s{background:#d4efdf;border-bottom:1px solid #7dcea0}.s.low{background:#fdebd0;
border-bottom-color:#f0b27a}
.g{color:#a6acaf}
.prompt{color:#808b96}
.note{font-size:12px;color:#566573}
"""


LEGEND = (
    '<p class="note"><span class="tokens s">highlighted</span> tokens were sampled by the '
    "engine and are trainable (loss mask 1, each with its logprob; hover for it); "
    '<span class="tokens s low">amber</span> ones the model found unlikely (logprob &lt; '
    f'{SURPRISE_LOGPROB}); <span class="tokens g">grey</span> tokens sit between turns (tool '
    "results, template glue): context, not trained on.</p>"
)


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
    body = "\n".join(
        [
            _header(summary),
            _cards(summary.total),
            "<h2>A trajectory, turn by turn</h2>",
            LEGEND,
            _session(showcase, decoder, open_=True, anchor="showcase")
            if showcase
            else "<p>No trajectories.</p>",
            "<h2>Rewards per sample</h2>",
            _reward_grid(ordered),
            "<h2>Time per stage</h2>",
            _timing(ordered, summary),
            "<h2>Every session</h2>",
            *(_session(r, decoder, open_=False) for r in ordered),
        ]
    )
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>Polar quickstart report</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
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


def _header(summary: RunSummary) -> str:
    facts = summary.facts
    items = [
        f"{_plural(facts.get('tasks'), 'task')} × {_plural(facts.get('samples'), 'sample')}",
        f"harness <b>{_e(facts.get('harness'))}</b>",
        f"runtime <b>{_e(facts.get('runtime'))}</b>",
        f"engine <b>{_e(facts.get('engine'))}</b> ({_e(facts.get('model'))})",
        f"wall time <b>{summary.wall_s:.0f} s</b>",
        datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    ]
    return "<h1>Polar quickstart report</h1><div class='facts'>" + " · ".join(items) + "</div>"


def _cards(total: Counts) -> str:
    merge = f"{total.merge_ratio:.2f}" if total.merge_ratio is not None else "–"
    reward = f"{total.mean_reward:.2f}" if total.mean_reward is not None else "–"
    cards = [
        (str(total.sessions), "sessions"),
        (f"{total.completed}/{total.timeout}/{total.error}", "completed / timeout / error"),
        (str(total.calls), "model calls captured"),
        (str(total.traces), "traces"),
        (merge, "calls per trace (merge)"),
        (f"{total.context_exact_calls}/{total.merged_calls}", "context-exact merged calls"),
        (f"{total.drift_turns}/{total.drift_tokens}", "drift turns / tokens"),
        (
            ", ".join(f"{k} {v}" for k, v in sorted(total.splits.items())) or "0",
            "trace splits by reason",
        ),
        (f"{total.trainable_tokens:,}", "trainable tokens"),
        (reward, f"mean reward ({total.passed} passed)"),
    ]
    inner = "".join(f"<div class='card'><b>{v}</b><span>{label}</span></div>" for v, label in cards)
    return f"<div class='cards'>{inner}</div>"


def _reward_grid(results: list[SessionResult]) -> str:
    by_task: dict[str, list[SessionResult]] = {}
    for r in results:
        by_task.setdefault(r.task_id, []).append(r)
    width = max((len(v) for v in by_task.values()), default=0)
    head = "".join(f"<th>#{i}</th>" for i in range(width))
    rows = []
    for task_id, rs in by_task.items():
        cells = "".join(f"<td>{_reward_cell(r)}</td>" for r in rs)
        rewards = [r.reward for r in rs if r.reward is not None]
        mean = f"{sum(rewards) / len(rewards):.2f}" if rewards else "–"
        rows.append(f"<tr><td>{_e(task_id)}</td>{cells}<td>{mean}</td></tr>")
    return f"<table><tr><th>task \\ sample</th>{head}<th>mean</th></tr>{''.join(rows)}</table>"


def _reward_cell(r: SessionResult) -> str:
    if r.reward is None:
        kind, label = "bad", r.status.value.lower()
    else:
        kind, label = ("pass" if r.reward > 0 else "fail"), f"{r.reward:g}"
    title = _e(r.error or r.status.value)
    return f"<a class='cell {kind}' href='#{_anchor(r)}' title='{title}'>{label}</a>"


def _timing(results: list[SessionResult], summary: RunSummary) -> str:
    longest = max((sum(r.timing.get(s, 0.0) for s in STAGES) for r in results), default=0.0)
    legend = "".join(
        f"<span><i style='background:{STAGE_COLORS[s]}'></i>{s} "
        f"(mean {summary.stage_mean_s.get(s, 0.0):.1f} s)</span>"
        for s in STAGES
    )
    rows = []
    for r in results:
        parts = []
        for stage in STAGES:
            seconds = r.timing.get(stage, 0.0)
            if longest and seconds > 0:
                share = 100 * seconds / longest
                parts.append(
                    f"<div style='width:{share:.2f}%;background:{STAGE_COLORS[stage]}' "
                    f"title='{stage} {seconds:.1f} s'></div>"
                )
        label = (
            f"{r.task_id} #{r.metadata.get('sample_index', '?')} · {r.timing.get('total', 0):.0f} s"
        )
        rows.append(
            f"<div class='bar-row'><div class='bar-label'>{_e(label)}</div>"
            f"<div class='bar'>{''.join(parts)}</div></div>"
        )
    return f"<div class='bars'><div class='legend'>{legend}</div>{''.join(rows)}</div>"


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


def _session(
    r: SessionResult, decoder: TokenText, *, open_: bool, anchor: str | None = None
) -> str:
    trajectory = r.trajectory
    meta = trajectory.metadata if trajectory else {}
    head = (
        f"{_e(r.task_id)} · sample {r.metadata.get('sample_index', '?')} · {r.status.value} · "
        f"reward {r.reward if r.reward is not None else '–'} · {meta.get('num_calls', 0)} calls · "
        f"{len(trajectory.traces) if trajectory else 0} traces"
    )
    parts = [f"<details class='session' id='{anchor or _anchor(r)}'{' open' if open_ else ''}>"]
    parts.append(f"<summary>{head}</summary>")
    facts = [f"session {r.session_id}"]
    if meta:
        facts.append(
            f"drift {meta.get('drift_turns', 0)} turns / {meta.get('drift_tokens', 0)} tokens"
        )
        if meta.get("breaks"):
            facts.append(f"breaks {_e(meta['breaks'])}")
    if r.error:
        facts.append(f"error: {_e(r.error[:300])}")
    parts.append(f"<div class='meta'>{' · '.join(facts)}</div>")
    for index, trace in enumerate(trajectory.traces if trajectory else []):
        parts.append(_trace(trace, index, decoder))
    parts.append("</details>")
    return "".join(parts)


def _trace(trace: Trace, index: int, decoder: TokenText) -> str:
    meta = trace.metadata
    parts = [
        f"<div class='meta'>trace {index}: {meta.get('num_calls', 1)} calls merged, "
        f"{len(trace.prompt_ids)} prompt tokens, {len(trace.response_ids)} response tokens "
        f"({sum(trace.loss_mask)} trainable), finish {_e(trace.finish_reason)}"
        + (f", break: {_e(meta['break_reason'])}" if meta.get("break_reason") else "")
        + "</div>",
        f"<details><summary class='note'>prompt ({len(trace.prompt_ids)} tokens, context only)"
        f"</summary><div class='tokens prompt'>{_e(decoder.join(trace.prompt_ids))}</div>"
        "</details>",
    ]
    turn = 0
    for start, end, trainable in _runs(trace.loss_mask):
        ids = trace.response_ids[start:end]
        if trainable:
            turn += 1
            logprobs = trace.response_logprobs[start:end] if trace.response_logprobs else None
            parts.append(_sampled_turn(turn, ids, logprobs, decoder))
        else:
            parts.append(
                f"<div class='turn inter'><h4>between turns · {len(ids)} tokens · not trained"
                f"</h4><div class='tokens g'>{_e(decoder.join(ids))}</div></div>"
            )
    return "".join(parts)


def _sampled_turn(
    turn: int, ids: list[int], logprobs: list[float] | None, decoder: TokenText
) -> str:
    spans = []
    for i, token_id in enumerate(ids):
        lp = logprobs[i] if logprobs is not None else None
        low = " low" if lp is not None and lp < SURPRISE_LOGPROB else ""
        title = f"id {token_id}" + (f" · logprob {lp:.3f}" if lp is not None else "")
        spans.append(f"<span class='s{low}' title='{title}'>{_e(decoder(token_id))}</span>")
    mean = f" · mean logprob {sum(logprobs) / len(logprobs):.2f}" if logprobs else ""
    return (
        f"<div class='turn'><h4>turn {turn} · sampled · {len(ids)} tokens{mean}</h4>"
        f"<div class='tokens'>{''.join(spans)}</div></div>"
    )


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


def _plural(count: object, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
