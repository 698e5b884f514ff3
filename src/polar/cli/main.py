"""The ``polar`` command: one module per command group, each adding its own subparser."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from polar import __version__
from polar.cli import (
    capture,
    check_engine,
    demo,
    generate,
    harness,
    quickstart,
    ray,
    rollout,
    serve_engine,
    serve_gateway,
    swe,
    train,
)
from polar.errors import PolarError
from polar.logs import FORMATS, LEVELS, choose_settings, configure_logging

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
    check_engine,
    ray,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polar", description="Token-faithful rollouts over any LLM agent harness."
    )
    parser.add_argument("--version", action="version", version=f"polar {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    _add_log_options(parser, default=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    for command_parser in sub.choices.values():
        # Also after the command (`polar serve-rollout --log-format json`), where given.
        _add_log_options(command_parser, default=argparse.SUPPRESS)
    return parser


def _add_log_options(parser: argparse.ArgumentParser, default: object) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-format",
        choices=FORMATS,
        default=default,
        help="log lines as JSON objects or text; auto (the default): text on a terminal, JSON "
        "otherwise (env POLAR_LOG_FORMAT)",
    )
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default=default,
        help="Polar's log level (env POLAR_LOG_LEVEL; default warning, info for serve-gateway "
        "and serve-rollout)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        log_format, log_level = choose_settings(
            args.log_format,
            "debug" if args.verbose else args.log_level,
            default_level=getattr(args, "default_log_level", "warning"),
        )
        configure_logging(log_format, log_level)
        return int(args.func(args) or 0)
    except PolarError as exc:
        print(f"polar: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
