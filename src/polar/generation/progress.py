"""The live view of a generation run: per repository, attempts queued, running, done and
accepted, the acceptance rate so far (earlier runs into the directory included), tokens and
elapsed time. On a terminal it redraws in place; in a log (CI) the run prints one line per
finished attempt instead."""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from polar.generation.attempts import AttemptRecord
from polar.generation.collect import Collector


class GenerateView:
    """Renders the collector's state next to what the ledger held before this run."""

    def __init__(self, collector: Collector, earlier: list[AttemptRecord]) -> None:
        self.collector = collector
        self.earlier = earlier
        self.started = time.monotonic()

    def render(self) -> Group:
        plans = list(self.collector.plans.values())
        stages = self.collector.stage_counts()
        repos = sorted({p.repo for p in plans} | {r.repo for r in self.earlier})
        table = Table(title="polar generate", title_justify="left")
        for name in ("repo", "earlier", "to run", "queued", "running", "done", "accepted", "rate"):
            table.add_column(name, justify="left" if name == "repo" else "right")
        for repo in repos:
            earlier = [r for r in self.earlier if r.repo == repo]
            new = [r for r in self.collector.records if r.repo == repo]
            planned = sum(len(p.attempts) for p in plans if p.repo == repo)
            counts = stages.get(repo, {})
            table.add_row(
                repo,
                _count(len(earlier)),
                _count(planned),
                _count(counts.get("queued", 0)),
                _count(counts.get("running", 0)),
                _count(len(new)),
                _count(sum(r.accepted for r in new)),
                _rate(earlier + new),
            )
        records = self.collector.records
        elapsed = time.monotonic() - self.started
        footer = Text(
            f"done {len(records)}/{sum(len(p.attempts) for p in plans)}   "
            f"accepted {sum(r.accepted for r in records)}   "
            f"rate {_rate(self.earlier + records)}   "
            f"prompt tokens {sum(r.prompt_tokens for r in records):,}   "
            f"sampled tokens {sum(r.sampled_tokens for r in records):,}   "
            f"elapsed {elapsed:.0f}s"
        )
        return Group(table, footer)

    def line(self, record: AttemptRecord) -> str:
        """One finished attempt, for logs."""
        verdict = "accepted" if record.accepted else "rejected"
        extra = f" ({record.error[:120]})" if record.error else ""
        return (
            f"[{time.monotonic() - self.started:5.0f}s] {record.instance_id} attempt "
            f"{record.attempt}: {record.status.value} {verdict} reward {record.reward} "
            f"{record.wall_s:.0f}s {record.prompt_tokens + record.sampled_tokens:,} tokens{extra}"
        )


def _count(n: int) -> str:
    return str(n) if n else "·"


def _rate(records: list[AttemptRecord]) -> str:
    if not records:
        return "-"
    return f"{sum(r.accepted for r in records) / len(records):.0%}"
