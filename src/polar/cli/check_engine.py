"""``polar check-engine URL``: probe a user's own engine for family, parity and exactness."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

import orjson

from polar.cli.arguments import add_family_arguments, positive_int


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "check-engine",
        help="probe an engine through the gateway: detected family, whole-prompt parity with "
        "its own chat rendering, exact captures and merged contexts; exit 1 on any mismatch",
    )
    parser.add_argument("url", metavar="URL", help="the engine's server root (without /v1)")
    parser.add_argument("--model", help="the served model (default: the engine's /v1/models)")
    parser.add_argument(
        "--tokenizer",
        help="the served model's tokenizer: HF directory, .gguf file or hub id (default: the "
        "model directory the engine reports)",
    )
    parser.add_argument("--chat-template", help="a .jinja file replacing the tokenizer's own")
    add_family_arguments(parser)
    parser.add_argument("--sessions", type=positive_int, default=3, help="tool sessions to run")
    parser.add_argument("--turns", type=positive_int, default=4, help="model calls per session")
    parser.add_argument(
        "--force-tools",
        action="store_true",
        help="send tool_choice (required, then the bash function by name) on every call, so a "
        "weak or random model still makes tool calls and the next turns are spliced onto them",
    )
    parser.add_argument(
        "--engine-reasoning-parser",
        metavar="NAME",
        help="the reasoning parser the engine runs (vLLM --reasoning-parser NAME): forced "
        "calls are then constrained only after the model ends its reasoning, as vLLM applies "
        "the grammar, and the records say so",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    from polar.stack.engine_check import check_engine, format_report

    check = asyncio.run(
        check_engine(
            args.url,
            model=args.model,
            tokenizer=args.tokenizer,
            chat_template=args.chat_template,
            family=args.family,
            tool_parser=args.tool_parser,
            sessions=args.sessions,
            turns=args.turns,
            force_tools=args.force_tools,
            engine_reasoning_parser=args.engine_reasoning_parser,
        )
    )
    if args.json:
        report = {**dataclasses.asdict(check), "ok": check.ok, "unexercised": check.unexercised}
        print(orjson.dumps(report).decode())
    else:
        print(format_report(check))
    return 0 if check.ok else 1
