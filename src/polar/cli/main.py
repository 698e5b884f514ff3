"""The ``polar`` command: one module per command group, each adding its own subparser."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from polar import __version__
from polar.cli import (
    capture,
    demo,
    generate,
    harness,
    quickstart,
    rollout,
    serve_engine,
    serve_gateway,
    swe,
    train,
)
from polar.errors import PolarError

COMMANDS = (
    quickstart,
    demo,
    generate,
    serve_gateway,
    serve_engine,
    rollout,
    harness,
    train,
    swe,
    capture,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polar", description="Token-faithful rollouts over any LLM agent harness."
    )
    parser.add_argument("--version", action="version", version=f"polar {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except PolarError as exc:
        print(f"polar: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
