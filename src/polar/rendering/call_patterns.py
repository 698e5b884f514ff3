"""Regular expressions that force a tool call in a family's own call format.

``tool_choice: required`` (or a named function) under gateway rendering becomes a structured
output constraint on the token prompt (vLLM ``structured_outputs.regex``, SGLang ``regex``):
the engine may then only sample text the family's parser reads as calls, in the exact format
the model writes its calls in when free, so the trained tokens stay the model's own format.

The patterns use only what both Python's ``re`` and the engines' regex grammars (xgrammar,
outlines, llguidance) accept: plain groups, character classes, ``*``/``+``/``?`` and
alternation. JSON argument objects nest at most :data:`ARGUMENT_DEPTH` containers deep (a
regular expression cannot count brackets); text values in XML formats may not contain ``</``.
"""

from __future__ import annotations

import json
from typing import Any

from polar.errors import InvalidRequest

WS = r"[ \t\n\r]*"
_STRING = r'"([^"\\\x00-\x1f]|\\(["\\/bfnrt]|u[0-9a-fA-F]{4}))*"'
_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?"
_SCALAR = f"{_STRING}|{_NUMBER}|true|false|null"
# An arguments object, its values, and theirs: deeper argument JSON cannot be sampled.
ARGUMENT_DEPTH = 3
# Text that never contains "</" (a value or a thought inside XML-like markup).
OPEN_TEXT = r"([^<]|<[^/])*"
_METACHARACTERS = set("\\.^$|?*+()[]{}")
_CONTROLS = {"\t": r"\t", "\n": r"\n", "\r": r"\r"}


def literal(text: str) -> str:
    """``text`` as a pattern matching exactly it: only true metacharacters are escaped (some
    engines' regex grammars refuse needless escapes such as ``\\<``)."""
    return "".join("\\" + c if c in _METACHARACTERS else _CONTROLS.get(c, c) for c in text)


def json_value(depth: int) -> str:
    """Any JSON value whose containers nest at most ``depth`` deep."""
    if depth <= 0:
        return f"({_SCALAR})"
    return f"({_SCALAR}|{json_object(depth)}|{json_array(depth)})"


def json_object(depth: int = ARGUMENT_DEPTH) -> str:
    """A JSON object (``depth`` counts this object itself)."""
    pair = f"{_STRING}{WS}:{WS}{json_value(depth - 1)}"
    return rf"\{{{WS}({pair}({WS},{WS}{pair})*{WS})?\}}"


def json_array(depth: int) -> str:
    value = json_value(depth - 1)
    return rf"\[{WS}({value}({WS},{WS}{value})*{WS})?\]"


def alternatives(patterns: list[str]) -> str:
    return "(" + "|".join(patterns) + ")"


def repeated(call: str, parallel: bool, separator: str = WS) -> str:
    """One call, or (parallel calls allowed) one or more."""
    return call if not parallel else f"{call}({separator}{call})*"


def forced_tools(tools: list[dict[str, Any]], choice: Any) -> list[dict[str, Any]]:
    """The function tools a ``tool_choice`` forces one of: every tool for ``required``, the
    named one for a named choice (a name not among ``tools`` is the caller's error)."""
    functions = [t["function"] for t in tools if isinstance(t.get("function"), dict)]
    if choice == "required":
        return functions
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    named = [f for f in functions if f.get("name") == name]
    if not named:
        raise InvalidRequest(f"tool_choice names the function {name!r}, which is not in tools")
    return named[:1]


def quoted_names(functions: list[dict[str, Any]]) -> str:
    """The functions' names as JSON strings, one of which must be sampled."""
    return alternatives([literal(json.dumps(str(f.get("name")))) for f in functions])


def parameter_names(function: dict[str, Any]) -> list[str]:
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return [str(name) for name in properties] if isinstance(properties, dict) else []


def hermes_call(functions: list[dict[str, Any]], arguments_key: str = "arguments") -> str:
    """``{"name": ..., "<arguments_key>": {...}}``: the JSON object Hermes-style and Llama 3
    calls are made of."""
    return (
        rf'\{{{WS}"name"{WS}:{WS}{quoted_names(functions)}{WS},{WS}'
        rf'"{arguments_key}"{WS}:{WS}{json_object()}{WS}\}}'
    )


def tagged_hermes_calls(functions: list[dict[str, Any]], parallel: bool) -> str:
    """``<tool_call>`` blocks of Hermes JSON (Hermes, Qwen2.5, Qwen3, SmolLM2 with our text)."""
    call = f"<tool_call>{WS}{hermes_call(functions)}{WS}</tool_call>"
    return repeated(call, parallel)


def qwen3_coder_calls(functions: list[dict[str, Any]], parallel: bool) -> str:
    """``<tool_call><function=NAME><parameter=P>V</parameter>...</function></tool_call>``, each
    parameter named as the function's schema names them (any name when it names none)."""
    blocks = []
    for function in functions:
        names = parameter_names(function)
        name = alternatives([literal(n) for n in names]) if names else r"[^>\n]+"
        parameter = rf"<parameter={name}>\n{OPEN_TEXT}\n</parameter>\n"
        blocks.append(
            rf"<function={literal(str(function.get('name')))}>\n({parameter})*</function>"
        )
    call = rf"<tool_call>\n{alternatives(blocks)}\n</tool_call>"
    return repeated(call, parallel, r"\n")


def with_thinking(pattern: str) -> str:
    """``pattern`` after an optional ``<think>...</think>`` block (Qwen3-style reasoning)."""
    return f"(<think>{OPEN_TEXT}</think>{WS})?{pattern}"


THINK_END = "</think>"
_THOUGHT_PREFIXES = (f"(<think>{OPEN_TEXT}</think>{WS})?", f"({OPEN_TEXT}</think>{WS})?")


def after_reasoning(pattern: str) -> str:
    """``pattern`` as a grammar that starts once the reasoning has ended (vLLM with a
    ``--reasoning-parser`` applies structured outputs only after the model samples the end of
    its reasoning, ``</think>``): the calls, after the whitespace the model may write first,
    without the optional thought the full pattern begins with."""
    for prefix in _THOUGHT_PREFIXES:
        if pattern.startswith(prefix):
            return WS + pattern.removeprefix(prefix)
    return WS + pattern


def reasoning_ended(prompt_ids: list[int], start_id: int | None, end_id: int | None) -> bool:
    """Whether an engine's reasoning parser takes the reasoning as ended by the prompt alone
    (vLLM: the last reasoning start or end token in the prompt is an end), in which case its
    grammar applies from the first sampled token."""
    for token in reversed(prompt_ids):
        if token == end_id:
            return True
        if token == start_id:
            return False
    return False
