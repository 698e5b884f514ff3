"""The acceptance report's numbers, per repository and overall, in every form it is written."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from polar.generation.acceptance import acceptance, acceptance_table, markdown, write_acceptance
from polar.generation.attempts import AttemptRecord
from polar.schemas.task import SessionStatus


def rec(
    instance: str, attempt: int, repo: str, status: str, ok: bool, **spend: float
) -> AttemptRecord:
    return AttemptRecord(
        instance_id=instance,
        attempt=attempt,
        repo=repo,
        status=SessionStatus(status),
        accepted=ok,
        passed=ok,
        session_id=f"s{instance}{attempt}",
        task_id="t",
        run=1,
        result="r",
        prompt_tokens=int(spend.get("prompt", 0)),
        sampled_tokens=int(spend.get("sampled", 0)),
        calls=int(spend.get("calls", 0)),
        wall_s=spend.get("wall", 0.0),
    )


RECORDS = [
    rec("a1", 0, "acme/alpha", "COMPLETED", True, prompt=100, sampled=10, calls=2, wall=10.0),
    rec("a1", 1, "acme/alpha", "COMPLETED", False, prompt=200, sampled=20, calls=3, wall=20.0),
    rec("a2", 0, "acme/alpha", "TIMEOUT", False, prompt=300, sampled=30, calls=4, wall=30.0),
    rec("b1", 0, "beta/beta", "COMPLETED", True, prompt=50, sampled=5, calls=1, wall=5.5),
    rec("b1", 1, "beta/beta", "COMPLETED", True, prompt=50, sampled=5, calls=1, wall=4.5),
    rec("c1", 0, "gamma/gamma", "ERROR", False),
]


def test_per_repo_and_overall() -> None:
    report = acceptance(RECORDS, {"source": "bundled"})
    assert list(report.repos) == ["acme/alpha", "beta/beta", "gamma/gamma"]
    alpha = report.repos["acme/alpha"]
    assert (alpha.instances, alpha.solved, alpha.attempts, alpha.accepted) == (2, 1, 3, 1)
    assert (alpha.completed, alpha.timeout, alpha.error) == (2, 1, 0)
    assert alpha.rate is not None and abs(alpha.rate - 1 / 3) < 1e-9
    assert (alpha.prompt_tokens, alpha.sampled_tokens, alpha.calls) == (600, 60, 9)
    assert alpha.wall_s == 60.0
    beta = report.repos["beta/beta"]
    assert (beta.instances, beta.solved, beta.attempts, beta.accepted, beta.rate) == (
        1,
        1,
        2,
        2,
        1.0,
    )
    assert report.repos["gamma/gamma"].rate == 0.0
    total = report.total
    assert (total.instances, total.solved, total.attempts, total.accepted) == (4, 2, 6, 3)
    assert total.rate == 0.5
    assert (total.prompt_tokens, total.sampled_tokens, total.wall_s) == (700, 70, 70.0)


def test_empty_report_has_no_rate() -> None:
    report = acceptance([])
    assert report.repos == {} and report.total.attempts == 0 and report.total.rate is None
    assert "| all | 0 | 0 | 0 | 0 | - |" in markdown(report).replace("**", "")


def test_written_forms_agree(tmp_path: Path) -> None:
    report = acceptance(RECORDS, {"source": "bundled"})
    as_json, as_md = write_acceptance(tmp_path, report)
    data = json.loads(as_json.read_text())
    assert data["total"]["attempts"] == 6 and data["total"]["accepted"] == 3
    assert data["total"]["rate"] == 0.5
    assert data["repos"]["acme/alpha"]["rate"] == 0.3333
    assert data["facts"] == {"source": "bundled"}
    text = as_md.read_text()
    assert "| acme/alpha | 2 | 1 | 3 | 1 | 33.3% | 1 | 0 | 60s | 600 | 60 |" in text
    assert "| **all** | **4** | **2** | **6** | **3** | **50.0%** |" in text
    assert "- source: bundled" in text
    console = Console(record=True, width=160)
    console.print(acceptance_table(report))
    shown = console.export_text()
    assert "beta/beta" in shown and "100.0%" in shown and "50.0%" in shown


def test_the_report_shows_the_delivered_fraction_with_its_reasons(tmp_path: Path) -> None:
    from polar.generation.attempts import Spend, attempt_record
    from polar.schemas.token_delivery import LostTokens, TokenDelivery

    from .results import result

    done = result(session_id="ps-1", sample=0)
    timed_out = result(session_id="ps-2", sample=1, status=SessionStatus.TIMEOUT, passed=False)
    records = [
        attempt_record(
            r, instance_id="i", attempt=n, repo="acme/alpha", run=1, stored="r", spend=Spend()
        )
        for n, r in enumerate(
            r.model_copy(
                update={
                    "trajectory": r.trajectory.model_copy(
                        update={
                            "metadata": {"delivery": {"sampled_tokens": 3, "delivered_tokens": 3}}
                        }
                    )
                }
            )
            for r in (done, timed_out)
        )
    ]
    records.append(RECORDS[-1])  # a ledger line from before delivery was counted
    report = acceptance(records)
    assert report.total.delivery == TokenDelivery(
        sampled_tokens=6,
        delivered_tokens=3,
        lost=LostTokens(timeout=3),
        sessions=3,
        unknown_sessions=1,
    )
    text = markdown(report)
    assert "| 50.0% |" in text
    assert "delivered 50.0% of 6 sampled tokens (lost: timeout 3); 1 session(s) not counted" in text
    back = AttemptRecord.model_validate_json(records[1].model_dump_json())
    assert back.delivery == records[1].delivery
