"""The regexes that force a tool call: what each family's own parser reads back as calls, and
nothing else (plain text, another tool, a second call when parallel calls are off)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.errors import InvalidRequest
from polar.rendering.call_patterns import ARGUMENT_DEPTH, forced_tools, json_object, literal
from polar.rendering.parsers.registry import get_tool_parser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "read.file", "parameters": {"type": "object"}}},
]
HERMES = '<tool_call>\n{"name": "shell", "arguments": {"command": "ls -la"}}\n</tool_call>'
CODER = (
    "<tool_call>\n<function=shell>\n<parameter=command>\nls -la\n</parameter>\n</function>\n"
    "</tool_call>"
)
LLAMA = '{"name": "shell", "parameters": {"command": "ls -la"}}'
SAMPLES = {
    "hermes": HERMES,
    "qwen3": "<think>\nList it.\n</think>\n\n" + HERMES,
    "qwen3_coder": CODER,
    "llama3_json": LLAMA,
}


def _pattern(parser: str, choice: object = "required", parallel: bool = True) -> re.Pattern[str]:
    found = get_tool_parser(parser).call_pattern(forced_tools(TOOLS, choice), parallel)
    assert found is not None
    return re.compile(found)


@pytest.mark.parametrize("parser", sorted(SAMPLES))
def test_a_forced_call_matches_and_parses_back_as_that_call(parser: str) -> None:
    text = SAMPLES[parser]
    assert _pattern(parser).fullmatch(text)
    calls = get_tool_parser(parser).parse(text, TOOLS).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("shell", {"command": "ls -la"})]


@pytest.mark.parametrize("parser", sorted(SAMPLES))
def test_plain_text_and_other_tools_do_not_match(parser: str) -> None:
    pattern = _pattern(parser, {"type": "function", "function": {"name": "read.file"}})
    assert not pattern.fullmatch(SAMPLES[parser])  # a call to shell, but read.file was named
    assert not pattern.fullmatch("I would rather not call a tool.")
    assert not _pattern(parser).fullmatch("Sure. " + SAMPLES[parser])


@pytest.mark.parametrize(("parser", "separator"), [("hermes", "\n"), ("llama3_json", "; ")])
def test_parallel_false_allows_exactly_one_call(parser: str, separator: str) -> None:
    two = SAMPLES[parser] + separator + SAMPLES[parser]
    assert _pattern(parser).fullmatch(two)
    assert not _pattern(parser, parallel=False).fullmatch(two)
    assert _pattern(parser, parallel=False).fullmatch(SAMPLES[parser])


def test_a_named_tool_not_in_tools_is_the_callers_error() -> None:
    with pytest.raises(InvalidRequest, match="'rm'"):
        forced_tools(TOOLS, {"type": "function", "function": {"name": "rm"}})


def test_names_are_matched_literally() -> None:
    assert literal("read.file") == r"read\.file"
    pattern = _pattern("hermes")
    assert pattern.fullmatch(HERMES.replace('"shell"', '"read.file"'))
    assert not pattern.fullmatch(HERMES.replace('"shell"', '"readXfile"'))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _JSON, max_size=3), st.booleans(), st.booleans())
def test_json_arguments_within_the_depth_match_in_any_layout(
    arguments: dict, indent: bool, ascii_only: bool
) -> None:
    text = json.dumps(arguments, indent=4 if indent else None, ensure_ascii=ascii_only)
    matched = re.fullmatch(json_object(), text) is not None
    assert matched == (_depth(arguments) <= ARGUMENT_DEPTH)
