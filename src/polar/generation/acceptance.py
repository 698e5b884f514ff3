"""The acceptance report: attempts, accepted and the rate, per repository and overall, with
the time and tokens they cost.

Computed from the ledger alone (every finished attempt of every run into the directory), so
``acceptance.json``, ``acceptance.md`` and the printed table agree with ``attempts.jsonl`` and
stay right across resumed runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich import box
from rich.table import Table

from polar.generation.attempts import AttemptRecord, write_atomic
from polar.schemas.task import SessionStatus
from polar.schemas.token_delivery import TokenDelivery

ACCEPTANCE_JSON = "acceptance.json"
ACCEPTANCE_MD = "acceptance.md"
TOTAL = "all"


@dataclass(frozen=True)
class Tally:
    """One repository's (or the whole set's) attempts and what they cost."""

    instances: int = 0
    solved: int = 0
    """Instances with at least one accepted attempt."""
    attempts: int = 0
    accepted: int = 0
    completed: int = 0
    timeout: int = 0
    error: int = 0
    wall_s: float = 0.0
    """Session seconds, summed over attempts (sessions run side by side)."""
    calls: int = 0
    prompt_tokens: int = 0
    sampled_tokens: int = 0
    delivery: TokenDelivery = field(default_factory=TokenDelivery)
    """Sampled tokens delivered to trainable traces, and lost by reason."""

    @property
    def rate(self) -> float | None:
        return self.accepted / self.attempts if self.attempts else None

    def as_dict(self) -> dict[str, Any]:
        rate = self.rate
        delivery = self.delivery.model_dump(mode="json") | {"fraction": self.delivery.fraction}
        return {
            **asdict(self),
            "rate": round(rate, 4) if rate is not None else None,
            "delivery": delivery,
        }


@dataclass(frozen=True)
class AcceptanceReport:
    repos: dict[str, Tally]
    total: Tally
    facts: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total.as_dict(),
            "repos": {repo: tally.as_dict() for repo, tally in self.repos.items()},
            "facts": self.facts,
        }


def tally(records: Iterable[AttemptRecord]) -> Tally:
    records = list(records)
    instances = {r.instance_id for r in records}
    solved = {r.instance_id for r in records if r.accepted}

    def status(s: SessionStatus) -> int:
        return sum(1 for r in records if r.status == s)

    return Tally(
        instances=len(instances),
        solved=len(solved),
        attempts=len(records),
        accepted=sum(1 for r in records if r.accepted),
        completed=status(SessionStatus.COMPLETED),
        timeout=status(SessionStatus.TIMEOUT),
        error=status(SessionStatus.ERROR),
        wall_s=round(sum(r.wall_s for r in records), 1),
        calls=sum(r.calls for r in records),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        sampled_tokens=sum(r.sampled_tokens for r in records),
        delivery=TokenDelivery.total(r.delivery or TokenDelivery.unknown() for r in records),
    )


def acceptance(
    records: Iterable[AttemptRecord], facts: Mapping[str, Any] | None = None
) -> AcceptanceReport:
    """The report over ``records`` (one per attempt), repositories in name order."""
    by_repo: dict[str, list[AttemptRecord]] = {}
    records = list(records)
    for record in records:
        by_repo.setdefault(record.repo, []).append(record)
    return AcceptanceReport(
        repos={repo: tally(by_repo[repo]) for repo in sorted(by_repo)},
        total=tally(records),
        facts=dict(facts or {}),
    )


def write_acceptance(out_dir: Path, report: AcceptanceReport) -> tuple[Path, Path]:
    """``acceptance.json`` and ``acceptance.md``; returns both paths."""
    as_json = out_dir / ACCEPTANCE_JSON
    as_md = out_dir / ACCEPTANCE_MD
    write_atomic(as_json, orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    write_atomic(as_md, markdown(report).encode())
    return as_json, as_md


COLUMNS = (
    "repo",
    "instances",
    "solved",
    "attempts",
    "accepted",
    "rate",
    "timeout",
    "error",
    "session time",
    "prompt tokens",
    "sampled tokens",
    "delivered",
)


def cells(name: str, t: Tally) -> list[str]:
    return [
        name,
        str(t.instances),
        str(t.solved),
        str(t.attempts),
        str(t.accepted),
        f"{t.rate:.1%}" if t.rate is not None else "-",
        str(t.timeout),
        str(t.error),
        _duration(t.wall_s),
        f"{t.prompt_tokens:,}",
        f"{t.sampled_tokens:,}",
        f"{t.delivery.fraction:.1%}" if t.delivery.fraction is not None else "-",
    ]


def markdown(report: AcceptanceReport) -> str:
    """The table as GitHub Markdown, with the run's facts under it."""
    lines = [
        "# Acceptance",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(["---", *["---:"] * (len(COLUMNS) - 1)]) + "|",
    ]
    for repo, t in report.repos.items():
        lines.append("| " + " | ".join(cells(repo, t)) + " |")
    lines.append("| " + " | ".join(f"**{c}**" for c in cells(TOTAL, report.total)) + " |")
    lines += ["", f"Sampled tokens: {report.total.delivery.describe()}."]
    if report.facts:
        lines.append("")
        lines.extend(f"- {key}: {_fact(value)}" for key, value in report.facts.items())
    return "\n".join(lines) + "\n"


def acceptance_table(report: AcceptanceReport, title: str = "Acceptance") -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAVY)
    table.add_column(COLUMNS[0], no_wrap=True)
    for column in COLUMNS[1:]:
        table.add_column(column, justify="right")
    for repo, t in report.repos.items():
        table.add_row(*cells(repo, t))
    table.add_section()
    table.add_row(*cells(TOTAL, report.total), style="bold")
    return table


def _fact(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
