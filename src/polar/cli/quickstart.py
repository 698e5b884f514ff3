"""``polar quickstart``: real rollouts end to end on a laptop (see docs/quickstart.md)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from polar.cli.arguments import positive_float, positive_int
from polar.cli.local_run import (
    add_engine_arguments,
    add_harness_argument,
    local_run_fields,
    run_console,
    run_reporting,
)
from polar.extras import require
from polar.quickstart.run import QuickstartOptions, run_quickstart
from polar.quickstart.summary import summary_table

CONSOLE_WIDTH = 110
"""The narrowest console the run reports to: the summary table, its delivered column
included, prints whole at this width (a pipe or CI log gets exactly this)."""

_DEFAULTS = QuickstartOptions()
TOOL_USE_OUTPUT = "polar-train-tool-use"
"""Where ``polar train tool_use`` writes its run (the bundled config's ``output_dir``)."""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "quickstart",
        help="run a real harness on toy tasks against a real model, end to end, on this machine",
        description=(
            "Start the embedded engine (SmolLM2-135M-Instruct), a rollout server and a gateway "
            "node on loopback, run the bundled toy tasks through a real agent harness in a "
            "sandbox, and write token-faithful trajectories, captures, logs, a summary table "
            "and an HTML report to a run directory. See docs/quickstart.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    size = p.add_argument_group("run size")
    size.add_argument(
        "--tasks", type=positive_int, default=_DEFAULTS.tasks, metavar="N",
        help="run the first N tasks of the suite",
    )  # fmt: skip
    size.add_argument(
        "--samples", type=positive_int, default=_DEFAULTS.samples, metavar="N",
        help="sessions per task (a GRPO group)",
    )  # fmt: skip
    size.add_argument(
        "--max-turns", type=positive_int, default=_DEFAULTS.max_turns, metavar="N",
        help="model calls per session (the harness's own turn limit, or the gateway's "
        "for those without one, such as Pi)",
    )  # fmt: skip
    size.add_argument(
        "--timeout", type=positive_float, default=_DEFAULTS.timeout_s, metavar="S",
        help="each session's budget in seconds, from sandbox start to harness exit, not "
        "counting the time its model calls spend with the engine",
    )  # fmt: skip
    size.add_argument(
        "--max-tokens", type=positive_int, default=_DEFAULTS.max_tokens, metavar="N",
        help="output tokens per model call",
    )  # fmt: skip
    size.add_argument(
        "--temperature", type=float, default=_DEFAULTS.temperature, metavar="T",
        help="sampling temperature, imposed on every call",
    )  # fmt: skip
    size.add_argument(
        "--workers", type=positive_int, default=None, metavar="N",
        help="sessions at once (default: all of them, up to 16)",
    )  # fmt: skip
    size.add_argument(
        "--suite", type=Path, default=None, metavar="FILE",
        help="a task suite YAML of your own (default: the bundled one)",
    )  # fmt: skip

    agent = p.add_argument_group("harness and sandbox")
    add_harness_argument(agent)
    agent.add_argument(
        "--stock-prompt", action="store_true",
        help="run Pi with its own system prompt and four tools (~1.5k tokens; the quickstart "
        "trims them to ~0.4k for a small model on a CPU)",
    )  # fmt: skip
    agent.add_argument(
        "--runtime", default=None, metavar="KIND",
        help="bubblewrap or local (default: bubblewrap when it can sandbox here, else local)",
    )  # fmt: skip

    engine = add_engine_arguments(p)
    engine.add_argument(
        "--trained", nargs="?", const=TOOL_USE_OUTPUT, default=None, metavar="DIR",
        help="serve the newest checkpoint of a training run instead of --model (default DIR: "
        f"{TOOL_USE_OUTPUT}, where `polar train tool_use` writes the model that learned to "
        "call Pi's tools, so sessions take several turns)",
    )  # fmt: skip

    p.add_argument(
        "--out", type=Path, default=None, metavar="DIR",
        help="run directory (default: polar-runs/quickstart-<time>)",
    )  # fmt: skip
    p.add_argument(
        "--dashboard", action="store_true",
        help="print the link to the rollout server's live dashboard (nodes, tasks, throughput, "
        "trajectories), served while the run lasts; see docs/observability.md",
    )  # fmt: skip
    p.set_defaults(func=run)


def trained_model(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a ``polar train`` run (an HF model directory)."""
    from polar.training.checkpoints import latest_checkpoint

    return latest_checkpoint(run_dir)


def run(args: argparse.Namespace) -> int:
    # Ctrl-C (SIGINT) stops the run and still writes it. A process started in the background
    # of a non-interactive shell inherits SIGINT *ignored*, and Python then keeps it ignored:
    # the run would go on to the end. Take the default handler back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not args.engine_url:
        require("embedded", "polar quickstart without --engine-url")
    if args.trained is not None and args.engine_url:
        print("polar quickstart: --trained serves a checkpoint on the embedded engine, so it "
              "cannot go with --engine-url", file=sys.stderr)  # fmt: skip
        return 2
    if args.trained is not None:
        model = trained_model(Path(args.trained))
        if model is None:
            print(
                f"polar quickstart --trained: no finished checkpoint under {args.trained}/"
                "checkpoints; run `polar train tool_use` first (about 20 minutes on 2 cores)",
                file=sys.stderr,
            )
            return 2
        args.model = str(model)
    options = QuickstartOptions(
        tasks=args.tasks,
        samples=args.samples,
        suite=args.suite,
        out=args.out,
        workers=args.workers,
        stock_prompt=args.stock_prompt,
        dashboard=args.dashboard,
        **local_run_fields(args),
    )
    console = run_console(CONSOLE_WIDTH, loads_model=True, parquet_file="trajectories.parquet")
    outcome = run_reporting(lambda: run_quickstart(options, console), console)
    if outcome is None:
        return 1
    console.print(summary_table(outcome.summary))
    console.print(f"run directory  {outcome.run_dir}")
    console.print(f"HTML report    {outcome.report}")
    if outcome.interrupted:
        return 130
    return 0 if outcome.summary.total.traces else 1
