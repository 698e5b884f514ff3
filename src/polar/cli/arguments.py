"""Argument types and set-up the commands share: checked numbers, ``OWNER/NAME=PATH`` pairs, a
quiet model load under a live view, and the harness and engine arguments of the local
commands (quickstart, generate)."""

from __future__ import annotations

import argparse
from typing import Any

from polar.harnesses.bundled import AGENT
from polar.stack.plan import DEFAULT_HARNESS
from polar.stack.run import LocalRunOptions


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def repo_path(text: str) -> tuple[str, str]:
    """``OWNER/NAME=PATH``: a repository's local git repository or bundle."""
    repo, sep, path = text.partition("=")
    if not sep or not repo or not path:
        raise argparse.ArgumentTypeError(f"expected OWNER/NAME=PATH, got {text!r}")
    return repo, path


def quiet_model_loading() -> None:
    """A live view says what is happening; transformers' own progress bars would garble it."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


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
