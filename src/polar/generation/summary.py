"""The end of a generation run on the console: the acceptance table, what this invocation
did, and where everything is."""

from __future__ import annotations

from rich.console import Console

from polar.generation.acceptance import acceptance_table
from polar.generation.run import GenerateRun


def print_summary(outcome: GenerateRun, console: Console) -> None:
    console.print(acceptance_table(outcome.report))
    console.print(f"sampled tokens: {outcome.report.total.delivery.describe()}", markup=False)
    recorded = outcome.recorded
    if outcome.run is None:
        console.print("nothing to run: the ledger already holds every attempt asked for")
    else:
        accepted = sum(r.accepted for r in recorded)
        console.print(
            f"run {outcome.run}: {len(recorded)} of {outcome.submitted} attempts finished, "
            f"{accepted} accepted"
            + (" (interrupted: rerun the same command to resume)" if outcome.interrupted else "")
        )
    dataset = outcome.dataset
    paths = [
        ("directory", outcome.out_dir, ""),
        ("ledger", outcome.ledger, f"{outcome.report.total.attempts} attempts"),
        ("dataset", dataset.jsonl, f"{dataset.rows} rows from {dataset.attempts} attempts"),
    ]
    if dataset.parquet is not None:
        paths.append(("", dataset.parquet, "the same rows, typed"))
    paths.append(("acceptance", outcome.acceptance_md, ""))
    paths.append(("", outcome.acceptance_json, ""))
    for label, path, note in paths:
        console.print(f"{label:<11} {path}" + (f"  ({note})" if note else ""), markup=False)
