"""The quickstart's HTML report: what it shows, and that what it shows stays text."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from polar.quickstart.report import write_report
from polar.quickstart.summary import summarize
from polar.schemas.task import SessionResult, SessionStatus
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus

TOOL_OUTPUT = "<script>alert('x')</script>"


class Tokenizer:
    """Token 1 decodes to a hostile tool output; every other id to a plain word."""

    def decode(self, ids: list[int]) -> str:
        return "".join(TOOL_OUTPUT if i == 1 else f"w{i} " for i in ids)


def session(session_id: str, sample: int, **fields: object) -> SessionResult:
    return SessionResult.model_validate(
        {
            "session_id": session_id,
            "task_id": "add-numbers",  # ids follow the id grammar: nothing to escape
            "status": SessionStatus.COMPLETED,
            "metadata": {"sample_index": sample},
            **fields,
        }
    )


def render(tmp_path: Path, results: list[SessionResult], tokenizer: object = None) -> str:
    summary = summarize(results, {r.session_id: 2 for r in results}, wall_s=3.0, facts={})
    return write_report(tmp_path / "report.html", summary, results, tokenizer=tokenizer).read_text()


@pytest.fixture
def results() -> list[SessionResult]:
    # Two sampled turns with a tool result between them; the second turn's token is a surprise.
    trace = Trace(
        prompt_ids=[7, 8],
        response_ids=[2, 3, 1, 4],
        loss_mask=[1, 1, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, -4.0],
        finish_reason="stop",
        metadata={"num_calls": 2},
    )
    trajectory = Trajectory(
        status=TrajectoryStatus.COMPLETED, traces=[trace], metadata={"num_calls": 2}
    )
    return [
        session("a", 0, trajectory=trajectory, reward=1.0, timing={"run": 2.0, "total": 2.0}),
        session("b", 1, status=SessionStatus.ERROR, error=f"harness said {TOOL_OUTPUT}"),
    ]


def test_trainable_tokens_are_highlighted_and_the_glue_between_turns_greyed(tmp_path, results):
    page = render(tmp_path, results, Tokenizer())
    assert "turn 1 · sampled · 2 tokens · mean logprob -0.15" in page
    assert "turn 2 · sampled · 1 tokens · mean logprob -4.00" in page
    assert "<span class='s' title='id 2 · logprob -0.100'>w2 </span>" in page
    assert "<span class='s low' title='id 4 · logprob -4.000'>w4 </span>" in page  # a surprise
    assert "between turns · 1 tokens · not trained" in page
    # Token text keeps its spacing exactly: nothing of the template's layout gets inside.
    for tokens in re.findall(r"<div class='tokens[^']*'>(.*?)</div>", page, re.S):
        assert "\n" not in tokens


def test_tool_output_and_errors_stay_text(tmp_path, results):
    page = render(tmp_path, results, Tokenizer())
    assert "<script" not in page
    text = html.unescape(page)
    assert f"<div class='tokens g'>{TOOL_OUTPUT}</div>" in text  # the tool result, greyed
    assert f"session b · error: harness said {TOOL_OUTPUT}" in text
    assert f"title='harness said {TOOL_OUTPUT}'" in text  # on its reward cell, quote and all
    assert "<td>add-numbers</td>" in text


def test_the_report_is_one_well_formed_self_contained_page(tmp_path, results):
    page = render(tmp_path, results)  # no tokenizer: ids shown as numbers
    assert "⟨7⟩ ⟨8⟩" in page
    for asset in ("<script", "<link", "<img", " src=", "url("):
        assert asset not in page
    ids = set(re.findall(r"id='([^']*)'", page))
    assert {"showcase", "s-a", "s-b"} <= ids
    assert all(href[1:] in ids for href in re.findall(r"href='([^']*)'", page))

    class Balance(HTMLParser):
        void = {"meta", "br", "img", "link", "input", "hr"}

        def __init__(self) -> None:
            super().__init__()
            self.open: list[str] = []

        def handle_starttag(self, tag: str, attrs: object) -> None:
            if tag not in self.void:
                self.open.append(tag)

        def handle_endtag(self, tag: str) -> None:
            assert self.open.pop() == tag

    parser = Balance()
    parser.feed(page)
    assert parser.open == []


def test_a_run_without_trajectories_still_reports(tmp_path):
    page = render(tmp_path, [])
    assert "No trajectories." in page
    assert "<th>task \\ sample</th><th>mean</th>" in page


def test_the_summary_and_the_report_show_the_delivered_fraction(tmp_path, results):
    from polar.quickstart.summary import summary_table
    from polar.schemas.token_delivery import LostTokens, TokenDelivery

    counted = {"num_calls": 2, "delivery": {"sampled_tokens": 5, "delivered_tokens": 3}}
    counted["delivery"]["lost"] = {"side_call": 2}
    first = results[0]
    trajectory = first.trajectory.model_copy(update={"metadata": counted})
    timed_out = session(
        "c", 2, status=SessionStatus.TIMEOUT, trajectory=trajectory, timing={"total": 1.0}
    )
    results = [first.model_copy(update={"trajectory": trajectory}), timed_out, results[1]]
    summary = summarize(results, {}, wall_s=1.0, facts={})
    assert summary.total.delivery == TokenDelivery(
        sampled_tokens=10,
        delivered_tokens=3,
        lost=LostTokens(side_call=4, timeout=3),
        sessions=3,
        unknown_sessions=1,
    )
    assert summary.as_dict()["total"]["delivery"]["fraction"] == 0.3
    caption = str(summary_table(summary).caption)
    assert "delivered 30.0% of 10 sampled tokens (lost: side call 4, timeout 3)" in caption
    page = write_report(tmp_path / "r.html", summary, results).read_text()
    assert "30.0%" in page and "side_call 4, timeout 3" in page


def test_the_summary_table_fits_the_quickstart_console_untruncated(results):
    """The table (with its delivered column) is printed whole at the width the quickstart's
    console has when its output is not a terminal (CI logs, pipes): no cell cut to '…'."""
    from rich.console import Console

    from polar.cli.local_run import run_console
    from polar.cli.quickstart import CONSOLE_WIDTH
    from polar.quickstart.summary import summary_table

    named = [r.model_copy(update={"task_id": "add-numbers"}) for r in results]
    summary = summarize(named, {}, wall_s=1.0, facts={})
    width = run_console(CONSOLE_WIDTH, loads_model=False, parquet_file="x").width
    console = Console(width=width, record=True, force_terminal=False)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "…" not in text
    assert "add-numbers" in text and "delivered" in text
