"""``polar demo``: the gateway in standalone capture mode, end to end, in one command.

The demo itself is :mod:`polar.stack.capture_demo`: a gateway on a free loopback port in front
of the scripted engine (real SmolLM2 tokenizer and chat template), a two-turn tool-calling
conversation through each of the four provider APIs (streaming and not), and every captured
token compared with what the engine produced. This command prints the table; records are
written as JSONL for inspection.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from polar.stack.capture_demo import CapturedCall, DemoGateway

COLUMNS = (
    "provider",
    "stream",
    "turn",
    "prompt ids",
    "sampled ids",
    "logprobs",
    "finish",
    "faithful",
)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="standalone capture demo: four provider APIs through the gateway, tokens checked",
    )
    p.add_argument("--out", default=None, help="directory for the capture DB and records JSONL")
    p.set_defaults(func=run)


def _table(calls: list[CapturedCall]) -> Table:
    table = Table(title="Captured calls (every token compared with the engine's reply)")
    for col in COLUMNS:
        table.add_column(
            col, justify="right" if col in ("prompt ids", "sampled ids", "logprobs") else "left"
        )
    for call in calls:
        table.add_row(
            call.provider,
            str(call.stream),
            str(call.turn),
            str(call.prompt_ids),
            str(call.sampled_ids),
            str(call.logprobs),
            call.finish_reason,
            "[green]yes[/]" if call.faithful else "[red]NO[/]",
        )
    return table


def run(args: argparse.Namespace) -> int:
    console = Console(width=max(Console().width, 110))
    out = Path(args.out or tempfile.mkdtemp(prefix="polar-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    console.print(
        "[bold]Polar standalone capture demo[/] (scripted engine, real SmolLM2 tokenizer)"
    )
    started = time.perf_counter()
    with DemoGateway(out) as gateway:
        console.print(f"gateway: {gateway.url}  capture store: {gateway.capture_db}")
        calls = gateway.converse()
    all_ok = all(call.faithful for call in calls)
    console.print(_table(calls))
    console.print(
        f"records: {out / 'records.jsonl'}   wall time: {time.perf_counter() - started:.1f} s"
    )
    console.print("[green]all captures token-faithful[/]" if all_ok else "[red]capture mismatch[/]")
    return 0 if all_ok else 1
