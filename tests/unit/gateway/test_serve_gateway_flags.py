"""``polar serve-gateway --family/--tool-parser``: the flags reach the render config, and their
help lists what the registries hold (all of it, and a parser added since)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from polar.cli.main import build_parser
from polar.cli.serve_gateway import load_config
from polar.rendering.families.registry import FAMILIES
from polar.rendering.parsers.hermes import HermesToolParser
from polar.rendering.parsers.registry import TOOL_PARSERS


def _help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    return " ".join(sub.choices["serve-gateway"].format_help().split())


def test_family_and_tool_parser_reach_the_render_config() -> None:
    args = build_parser().parse_args(
        ["serve-gateway", "--engine", "scripted", "--family", "qwen3", "--tool-parser", "hermes"]
    )
    render = load_config(args).render
    assert (render.family, render.tool_parser) == ("qwen3", "hermes")
    plain = load_config(build_parser().parse_args(["serve-gateway", "--engine", "scripted"]))
    assert plain.render.family is None and plain.render.tool_parser is None


@pytest.fixture
def toy_parser() -> Iterator[None]:
    TOOL_PARSERS.add("toy_parser", HermesToolParser)
    yield
    TOOL_PARSERS.remove("toy_parser")


@pytest.mark.usefixtures("toy_parser")
def test_the_help_lists_every_registered_family_and_parser() -> None:
    text = _help()
    names = [*FAMILIES.names(), *TOOL_PARSERS.names()]
    assert "toy_parser" in names and len(names) == 15 + 10
    missing = [name for name in names if f" {name}," not in text]
    assert not missing, missing
