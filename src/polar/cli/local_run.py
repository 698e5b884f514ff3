"""What the local commands (``polar quickstart``, ``polar generate``) share: their harness and
engine arguments, the console a run reports to, and how a harness or sandbox failure ends it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console

from polar.cli.arguments import positive_int, quiet_model_loading
from polar.errors import HarnessError, RuntimeStartError
from polar.extras import installed
from polar.harnesses.bundled import AGENT
from polar.stack.plan import DEFAULT_HARNESS
from polar.stack.run import LocalRunOptions

T = TypeVar("T")


def add_harness_argument(group: argparse._ArgumentGroup, note: str = "") -> None:
    """``--harness``, as every local command takes it."""
    group.add_argument(
        "--harness", default=DEFAULT_HARNESS, metavar="NAME",
        help=f"a preset (pi, opencode, codex, qwen_code, gemini_cli, claude_code) or {AGENT!r}, "
        f"the bundled Python agent{note}",
    )  # fmt: skip


def add_engine_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The ``engine`` group every local command takes: the embedded model, or a server."""
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--model", default=LocalRunOptions.model, metavar="SRC",
        help="embedded model: smollm2, tiny (a random 2-layer test model), an HF dir or a .gguf",
    )  # fmt: skip
    engine.add_argument(
        "--threads", type=positive_int, default=None, metavar="N",
        help="CPU threads of the embedded engine (default: all cores but one)",
    )  # fmt: skip
    engine.add_argument(
        "--engine-url", default=None, metavar="URL",
        help="a vLLM or SGLang server to use instead of the embedded engine",
    )  # fmt: skip
    engine.add_argument(
        "--engine-kind", default=LocalRunOptions.engine_kind, choices=("vllm", "sglang")
    )
    engine.add_argument(
        "--served-model", default=None, metavar="NAME",
        help="the model to ask the --engine-url server for (default: the first it lists)",
    )  # fmt: skip
    engine.add_argument(
        "--tokenizer", default=None, metavar="DIR",
        help="the served model's tokenizer, for token text (with --engine-url)",
    )  # fmt: skip
    return engine


def local_run_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`LocalRunOptions` fields, from the arguments every local command takes."""
    return {
        "harness": args.harness,
        "runtime": args.runtime,
        "max_turns": args.max_turns,
        "timeout_s": args.timeout,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "model": args.model,
        "engine_url": args.engine_url,
        "engine_kind": args.engine_kind,
        "served_model": args.served_model,
        "tokenizer": args.tokenizer,
        "threads": args.threads,
    }


def run_console(width: int, *, loads_model: bool, parquet_file: str) -> Console:
    """The console a run reports to, at least ``width`` wide; says up front when the run can
    write no ``parquet_file`` (no pyarrow)."""
    console = Console(width=max(Console().width, width))
    if loads_model and installed("render"):
        quiet_model_loading()
    if not installed("parquet"):
        note = f"note: no {parquet_file} without pyarrow: pip install 'polar[parquet]'"
        console.print(note, style="dim", markup=False)
    return console


def run_reporting(run: Callable[[], T], console: Console) -> T | None:
    """``run()``, or None when a harness or sandbox failed to start (said on ``console``)."""
    try:
        return run()
    except (HarnessError, RuntimeStartError) as exc:
        console.print(f"polar: error: {exc}", markup=False)
        return None
