"""Tool-call and reasoning parsers: exact formats per family, malformed turns, round trips."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from polar.errors import ConfigError
from polar.rendering.parsers.base import ParsedTurn, ToolParser
from polar.rendering.parsers.hermes import HermesToolParser
from polar.rendering.parsers.llama3_json import Llama3JsonToolParser
from polar.rendering.parsers.qwen3 import Qwen3ToolParser
from polar.rendering.parsers.qwen3_coder import Qwen3CoderToolParser
from polar.rendering.parsers.registry import TOOL_PARSERS, get_tool_parser
from polar.rendering.tool_text import parse_tool_calls, render_tool_call

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ID_RE = re.compile(r"call_[0-9a-f]{24}")

WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "write",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "force": {"type": "boolean"},
                "meta": {"type": "object"},
                "lines": {"type": "array"},
                "limit": {"type": ["integer", "null"]},
                "mode": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            },
        },
    },
}


def calls_of(turn: ParsedTurn) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) per call, after checking each id and that arguments are dumped JSON."""
    out = []
    for call in turn.tool_calls:
        assert ID_RE.fullmatch(call.id)
        args = json.loads(call.arguments)
        assert isinstance(args, dict)
        assert call.arguments == json.dumps(args, ensure_ascii=False)
        out.append((call.name, args))
    return out


HERMES_CASES = [
    pytest.param(
        'Reading.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>',
        "Reading.",
        [("read", {"path": "a.txt"})],
        id="one-call-after-text",
    ),
    pytest.param(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x": [1, 2]}}\n</tool_call>',
        "",
        [("a", {}), ("b", {"x": [1, 2]})],
        id="two-calls",
    ),
    pytest.param(
        '<tool_call>\n{"name": "f", "arguments": "{\\"k\\": 1}"}\n</tool_call>',
        "",
        [("f", {"k": 1})],
        id="arguments-as-json-string",
    ),
    pytest.param(
        '<tool_call>\n{\n  "name": "f",\n  "arguments": {\n    "k": 1,\n    "s": "x"\n  }\n}\n'
        "</tool_call>",
        "",
        [("f", {"k": 1, "s": "x"})],
        id="pretty-printed",
    ),
    pytest.param(
        'Écrire.\n<tool_call>\n{"name": "écrire", "arguments": {"texte": "日本語 ✓"}}\n</tool_call>',
        "Écrire.",
        [("écrire", {"texte": "日本語 ✓"})],
        id="non-ascii",
    ),
    pytest.param(
        '<tool_call>\n{"name": "unknown_tool", "arguments": {}}\n</tool_call>',
        "",
        [("unknown_tool", {})],
        id="unknown-name-kept",
    ),
    pytest.param("Just text.\n", "Just text.\n", [], id="no-calls-text-unchanged"),
]

HERMES_MALFORMED = [
    pytest.param("<tool_call>\n{not json}\n</tool_call>", id="bad-json"),
    pytest.param('<tool_call>\n{"arguments": {}}\n</tool_call>', id="no-name"),
    pytest.param('<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>', id="name-not-string"),
    pytest.param('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', id="args-list"),
    pytest.param('<tool_call>\n{"name": "f", "arguments": "{oops"}\n</tool_call>', id="args-str"),
    pytest.param('<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>', id="nan"),
    pytest.param('<tool_call>\n{"name": "f", "arguments": {"x": 1e400}}\n</tool_call>', id="inf"),
    pytest.param('<tool_call>\n["f", {}]\n</tool_call>', id="not-an-object"),
    pytest.param(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{bad}\n</tool_call>',
        id="second-of-two-broken",
    ),
    pytest.param('<tool_call>\n{"name": "f", "arguments": {}}', id="unclosed"),
]


@pytest.mark.parametrize(("text", "content", "calls"), HERMES_CASES)
def test_hermes_parses_calls_and_content(
    text: str, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    turn = HermesToolParser().parse(text)
    assert (turn.content, turn.reasoning, calls_of(turn)) == (content, None, calls)


@pytest.mark.parametrize("text", HERMES_MALFORMED)
def test_hermes_malformed_turn_is_plain_content(text: str) -> None:
    for parser in (HermesToolParser(), Qwen3ToolParser()):
        turn = parser.parse(text)
        assert (turn.content, turn.tool_calls) == (text, [])


def test_tool_text_parse_tool_calls_delegates_to_hermes() -> None:
    content, calls = parse_tool_calls(
        'Hi\n<tool_call>\n{"name": "f", "arguments": {"a": "é"}}\n</tool_call>'
    )
    assert content == "Hi"
    assert ID_RE.fullmatch(calls[0]["id"])
    assert calls[0]["type"] == "function"
    assert calls[0]["function"] == {"name": "f", "arguments": '{"a": "é"}'}
    assert parse_tool_calls("<tool_call>\n{x}\n</tool_call>") == (
        "<tool_call>\n{x}\n</tool_call>",
        [],
    )


QWEN3_CASES = [
    pytest.param(
        "<think>\nLet me read it.\n</think>\n\n<tool_call>\n"
        '{"name": "read", "arguments": {"path": "a"}}\n</tool_call>',
        "Let me read it.",
        "",
        [("read", {"path": "a"})],
        id="think-then-call",
    ),
    pytest.param(
        "Opened by the prompt.\n</think>\n\nThe answer is 4.",
        "Opened by the prompt.",
        "The answer is 4.",
        [],
        id="bare-close",
    ),
    pytest.param("<think>\n\n</think>\n\nHello", "", "Hello", [], id="empty-think"),
    pytest.param("Hello, no thinking.", None, "Hello, no thinking.", [], id="no-think"),
    pytest.param(
        "<think>\nstill thinking when the budget ran out",
        "still thinking when the budget ran out",
        "",
        [],
        id="unclosed-think-is-reasoning",
    ),
    pytest.param(
        '<think>\nmaybe <tool_call>\n{"name": "no", "arguments": {}}\n</tool_call>\n</think>\n\n'
        "Done.",
        'maybe <tool_call>\n{"name": "no", "arguments": {}}\n</tool_call>',
        "Done.",
        [],
        id="call-inside-thinking-is-not-a-call",
    ),
    pytest.param(
        "<think>\n考える\n</think>\n\n<tool_call>\n{bad}\n</tool_call>",
        "考える",
        "<tool_call>\n{bad}\n</tool_call>",
        [],
        id="malformed-call-keeps-reasoning",
    ),
]


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), QWEN3_CASES)
def test_qwen3_splits_reasoning_then_parses_hermes(
    text: str, reasoning: str | None, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    turn = Qwen3ToolParser().parse(text)
    assert (turn.reasoning, turn.content, calls_of(turn)) == (reasoning, content, calls)


def coder_call(name: str, params: list[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={p}>\n{v}\n</parameter>\n" for p, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CODER_CASES = [
    pytest.param(
        "I'll write it.\n\n"
        + coder_call(
            "write",
            [
                ("path", "a.txt"),
                ("count", "3"),
                ("ratio", "0.5"),
                ("force", "True"),
                ("meta", '{"k": [1, "é"]}'),
                ("lines", "[1, 2]"),
                ("limit", "None"),
                ("mode", "7"),
            ],
        ),
        "I'll write it.",
        [
            (
                "write",
                {
                    "path": "a.txt",
                    "count": 3,
                    "ratio": 0.5,
                    "force": True,
                    "meta": {"k": [1, "é"]},
                    "lines": [1, 2],
                    "limit": None,
                    "mode": "7",  # a union that allows string keeps the text
                },
            )
        ],
        id="schema-types",
    ),
    pytest.param(
        coder_call(
            "write",
            [("path", "123"), ("force", "false"), ("count", "many"), ("ratio", "1e400")],
        ),
        "",
        [("write", {"path": "123", "force": False, "count": "many", "ratio": "1e400"})],
        id="string-stays-string-and-misfit-kept",
    ),
    pytest.param(
        coder_call("write", [("path", "line one\n  indented\n\nlast")]),
        "",
        [("write", {"path": "line one\n  indented\n\nlast"})],
        id="multiline-value",
    ),
    pytest.param(
        coder_call("write", [("path", "\n\nkeeps inner newlines\n")]),
        "",
        [("write", {"path": "\n\nkeeps inner newlines\n"})],
        id="strips-one-newline-each-side",
    ),
    pytest.param(
        coder_call("other", [("n", "5"), ("s", "hello"), ("o", '{"a": 1}'), ("b", "true")]),
        "",
        [("other", {"n": 5, "s": "hello", "o": {"a": 1}, "b": True})],
        id="unknown-tool-json-or-string",
    ),
    pytest.param(
        coder_call("a", []) + "\n" + coder_call("b", [("x", "1")]),
        "",
        [("a", {}), ("b", {"x": 1})],
        id="two-calls-and-no-parameters",
    ),
    pytest.param(
        "<think>\nPlan.\n</think>\n\n" + coder_call("write", [("path", "ü.txt")]),
        "",
        [("write", {"path": "ü.txt"})],
        id="with-reasoning",
    ),
    pytest.param(
        "Text.\n<function=write>\n<parameter=path>\nx\n</parameter>\n</function>",
        "Text.",
        [("write", {"path": "x"})],
        id="bare-function-without-tool-call-wrapper",
    ),
]

CODER_MALFORMED = [
    pytest.param(
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
        id="no-function-close",
    ),
    pytest.param('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', id="hermes-json"),
    pytest.param(coder_call("f", [("a", "1"), ("a", "2")]), id="repeated-parameter"),
    pytest.param(
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\nstray\n</function>\n</tool_call>",
        id="text-between-parameters",
    ),
    pytest.param(
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
        id="unclosed-parameter",
    ),
    pytest.param("<tool_call>\n<function= >\n</function>\n</tool_call>", id="empty-name"),
    pytest.param(
        coder_call("ok", []) + "\n<tool_call>\n<function=x>\n</tool_call>",
        id="second-of-two-broken",
    ),
]


@pytest.mark.parametrize(("text", "content", "calls"), CODER_CASES)
def test_qwen3_coder_parses_xml_calls_with_schema_types(
    text: str, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    turn = Qwen3CoderToolParser().parse(text, [WRITE_TOOL])
    assert (turn.content, calls_of(turn)) == (content, calls)


@pytest.mark.parametrize("text", CODER_MALFORMED)
def test_qwen3_coder_malformed_turn_is_plain_content(text: str) -> None:
    turn = Qwen3CoderToolParser().parse(text, [WRITE_TOOL])
    assert (turn.content, turn.reasoning, turn.tool_calls) == (text, None, [])


def test_qwen3_coder_reasoning() -> None:
    turn = Qwen3CoderToolParser().parse("<think>\nPlan.\n</think>\n\nAnswer.")
    assert (turn.reasoning, turn.content, turn.tool_calls) == ("Plan.", "Answer.", [])


LLAMA_CASES = [
    pytest.param(
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        [("get_weather", {"city": "Paris"})],
        id="parameters",
    ),
    pytest.param(
        '<|python_tag|>{"name": "f", "arguments": {"x": 1}}', [("f", {"x": 1})], id="python-tag"
    ),
    pytest.param(
        '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"s": "日本"}}',
        [("a", {}), ("b", {"s": "日本"})],
        id="semicolon-separated",
    ),
    pytest.param(
        '\n{\n  "name": "f",\n  "parameters": {\n    "q": "x"\n  }\n}\n',
        [("f", {"q": "x"})],
        id="pretty-printed",
    ),
    pytest.param(
        '{"name": "f", "parameters": "{\\"q\\": 2}"}', [("f", {"q": 2})], id="parameters-as-string"
    ),
]

LLAMA_PLAIN = [
    pytest.param("The weather is fine.", id="prose"),
    pytest.param('Sure: {"name": "f", "parameters": {}}', id="prose-before-json"),
    pytest.param('{"name": "f", "parameters": {}} and more', id="text-after"),
    pytest.param('{"name": "Bob", "age": 3}', id="json-answer-not-a-call"),
    pytest.param('{"name": "f", "parameters": [1]}', id="parameters-not-object"),
    pytest.param('{"name": "f", "parameters": {"x": Infinity}}', id="infinity"),
    pytest.param('{"name": "f", "parameters": {}}; {"name": "g"', id="second-truncated"),
    pytest.param('<|python_tag|>brave_search.call(query="x")', id="builtin-python-form"),
]


@pytest.mark.parametrize(("text", "calls"), LLAMA_CASES)
def test_llama3_json_whole_turn_is_calls(
    text: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    turn = Llama3JsonToolParser().parse(text)
    assert (turn.content, turn.reasoning, calls_of(turn)) == ("", None, calls)


@pytest.mark.parametrize("text", LLAMA_PLAIN)
def test_llama3_json_anything_else_is_plain_content(text: str) -> None:
    turn = Llama3JsonToolParser().parse(text)
    assert (turn.content, turn.tool_calls) == (text, [])


def test_registry_names_and_plugins() -> None:
    assert {"glm47", "hermes", "llama3_json", "qwen3", "qwen3_coder"} <= set(TOOL_PARSERS.names())
    for name in TOOL_PARSERS:
        parser = get_tool_parser(name)
        assert isinstance(parser, ToolParser) and parser.name == name
    plugin = get_tool_parser("polar.rendering.parsers.hermes:HermesToolParser")
    assert isinstance(plugin, HermesToolParser)
    with pytest.raises(ConfigError, match="unknown tool parser"):
        get_tool_parser("nope")
    with pytest.raises(ConfigError, match="not a ToolParser"):
        get_tool_parser("collections:OrderedDict")


# Round trips: a call rendered the way each family's chat template renders it parses back.

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,30}", fullmatch=True)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=15,
)
arguments = st.dictionaries(names, json_values, max_size=5)
MARKUP = ("</tool_call>", "</function>", "</parameter>", "<parameter=")


def no_markup(args: dict[str, Any]) -> bool:
    """A value holding the closing markup cannot round-trip in any of these formats."""
    text = json.dumps(args, ensure_ascii=False)
    return not any(m in text or m in json.dumps(args) for m in MARKUP)


@PROPERTY
@given(name=names, args=arguments, content=st.text(max_size=30))
def test_hermes_round_trip(name: str, args: dict[str, Any], content: str) -> None:
    assume(no_markup(args) and "<tool_call>" not in content)
    text = (content + "\n" if content else "") + render_tool_call(name, args)
    turn = HermesToolParser().parse(text)
    assert calls_of(turn) == [(name, args)]
    assert turn.content == content.rstrip("\n")


@PROPERTY
@given(name=names, args=arguments, reasoning=st.text(max_size=30))
def test_qwen3_round_trip(name: str, args: dict[str, Any], reasoning: str) -> None:
    assume(no_markup(args) and "think>" not in reasoning)
    # The Qwen3 template: tojson of arguments, inside a {"name": ...} object it writes by hand.
    call = (
        '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(args) + "}\n</tool_call>"
    )
    text = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + call
    turn = Qwen3ToolParser().parse(text)
    assert calls_of(turn) == [(name, args)]
    assert (turn.reasoning, turn.content) == (reasoning.strip("\n"), "")


def schema_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}[
        type(value)
    ]


def coder_value(value: Any) -> str:
    """What the Qwen3-Coder template writes: tojson for containers, Jinja's ``string`` else."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@PROPERTY
@given(name=names, args=arguments)
def test_qwen3_coder_round_trip(name: str, args: dict[str, Any]) -> None:
    assume(no_markup(args))
    tool = {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": schema_type(v)} for k, v in args.items()},
            },
        },
    }
    text = coder_call(name, [(k, coder_value(v)) for k, v in args.items()])
    turn = Qwen3CoderToolParser().parse(text, [tool])
    assert calls_of(turn) == [(name, args)]


@PROPERTY
@given(calls=st.lists(st.tuples(names, arguments), min_size=1, max_size=3))
def test_llama3_json_round_trip(calls: list[tuple[str, dict[str, Any]]]) -> None:
    # The Llama 3.1 template: {"name": "<name>", "parameters": <arguments | tojson>}
    text = "; ".join(
        '{"name": "' + name + '", "parameters": ' + json.dumps(args) + "}" for name, args in calls
    )
    turn = Llama3JsonToolParser().parse(text)
    assert calls_of(turn) == calls
