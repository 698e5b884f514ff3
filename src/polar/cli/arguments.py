"""Argument types and set-up the commands share: checked numbers, ``OWNER/NAME=PATH`` pairs, a
quiet model load under a live view."""

from __future__ import annotations

import argparse


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


def add_family_arguments(parser: argparse.ArgumentParser) -> None:
    """``--family`` and ``--tool-parser``, their help listing what the registries hold now (a
    family or parser added there shows up here)."""
    from polar.rendering.families.registry import FAMILIES
    from polar.rendering.parsers.registry import TOOL_PARSERS

    parser.add_argument(
        "--family",
        help=f"the served model's family, in place of the one detected from its tokenizer: "
        f"{', '.join(FAMILIES.names())}, or module:Class",
    )
    parser.add_argument(
        "--tool-parser",
        help=f"override the family's tool-call parser: {', '.join(TOOL_PARSERS.names())}, or "
        "module:Class",
    )


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
