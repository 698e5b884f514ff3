"""Kimi K2.5/K2.6's TypeScript-style tool declarations (the template's ``tools_ts_str``).

Kimi's tokenizer code does not hand its template the tools as JSON: its ``apply_chat_template``
sorts every dict in the tools by key, encodes the functions as a TypeScript ``namespace
functions { type NAME = (_: {...}) => any; }`` block and passes that as ``tools_ts_str``; the
template writes it in place of ``tools | tojson``. vLLM and SGLang load that tokenizer code, so
this is what the served model reads. Written from the format's facts (Moonshot's
``tool_declaration_ts.py``): required fields first, each group by name; ``integer`` is
``number``; descriptions, string/number/array constraints and defaults become ``//`` comments;
``$defs`` become interfaces and a ``$ref: "#"`` makes the root an ``interface parameters``.
A schema the format cannot express raises ``ValueError`` (the tokenizer then falls back to JSON).
"""

from __future__ import annotations

import json
from typing import Any

_INDENT = "  "
_FIELDS = ",\n"
# JSON Schema keywords the format shows as a constraint comment, per scalar/array type.
_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
    "array": ("minItems", "maxItems"),
}
# A ``type: [...]`` list: each member's TypeScript spelling.
_UNION_TYPES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}
_ROOT = "parameters"


def deep_sorted(value: Any) -> Any:
    """``value`` with every dict's keys sorted, at any depth (lists keep their order)."""
    if isinstance(value, dict):
        return {key: deep_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [deep_sorted(item) for item in value]
    return value


def typescript_declarations(tools: list[dict[str, Any]]) -> str:
    """The ``tools_ts_str`` Kimi's tokenizer passes its template for ``tools`` (already
    :func:`deep_sorted`); ``""`` when none is a function tool."""
    functions = [
        _function(tool["function"])
        for tool in tools
        if tool.get("type") == "function" and tool.get("function")
    ]
    if not functions:
        return ""
    body = "\n".join(functions)
    return f"# Tools\n\n## functions\nnamespace functions {{\n{body}\n}}\n"


class _Defs:
    """The ``$defs`` met so far (in order) and whether any ``$ref`` points at the root."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}
        self.self_ref = False

    def name_of(self, ref: str) -> str:
        if ref == "#":
            self.self_ref = True
            return _ROOT
        if ref.startswith("#/$defs/"):
            name = ref.split("/")[-1]
            if name not in self.schemas:
                raise ValueError(f"Reference not found: {ref}")
            return name
        raise ValueError(f"Unsupported reference format: {ref}")


def _function(function: dict[str, Any]) -> str:
    defs = _Defs()
    parameters = function.get("parameters") or {}
    signature = _object(parameters, "", defs)
    interfaces = []
    if defs.self_ref:
        fields = _FIELDS.join(
            _field(name, prop, name not in parameters.get("required", []), _INDENT, defs)
            for name, prop in parameters.get("properties", {}).items()
        )
        body = f"\n{fields}\n" if fields else ""
        interfaces.append(f"interface {_ROOT} {{{body}}}")
        signature = _ROOT
    for name, schema in list(defs.schemas.items()):
        described = _comment(schema["description"]) + "\n" if schema.get("description") else ""
        interfaces.append(f"{described}interface {name} {_type(schema, '', defs)}")
    description = function.get("description")
    parts = [
        "\n".join(interfaces),
        _comment(description) if description else "",
        f"type {function.get('name', 'function')} = (_: {signature}) => any;",
    ]
    return "\n".join(part for part in parts if part)


def _comment(text: str, indent: str = "") -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _docstring(schema: Any, indent: str) -> str:
    """The comment lines above a field or array item: its description, then constraints."""
    if not isinstance(schema, dict) or "$ref" in schema or "anyOf" in schema:
        keys: tuple[str, ...] = ()
    elif "enum" in schema or isinstance(schema.get("type"), list):
        keys = ()
    else:
        keys = _CONSTRAINTS.get(str(schema.get("type")), ())
    lines = []
    if isinstance(schema, dict) and schema.get("description"):
        lines.append(_comment(schema["description"], indent))
    constraints = sorted(((k, schema[k]) for k in keys if k in schema), key=lambda kv: kv[0])
    if constraints:
        lines.append(indent + "// " + ", ".join(f"{k}: {v}" for k, v in constraints))
    return "".join(line + "\n" for line in lines)


def _field(name: str, schema: Any, optional: bool, indent: str, defs: _Defs) -> str:
    comments = _docstring(schema, indent)
    default = schema.get("default") if isinstance(schema, dict) else None
    if default is not None:
        numeric = isinstance(default, int | float)
        shown = repr(default) if numeric else json.dumps(default, ensure_ascii=False)
        comments += f"{indent}// Default: {shown}\n"
    mark = "?" if optional else ""
    return f"{comments}{indent}{name}{mark}: {_type(schema, indent, defs)}"


def _type(schema: Any, indent: str, defs: _Defs) -> str:
    """The TypeScript type of one JSON Schema at ``indent`` (the indent of its own line)."""
    if isinstance(schema, bool):
        return "any" if schema else "null"
    if "$ref" in schema:
        return defs.name_of(schema["$ref"])
    if "anyOf" in schema:
        return " | ".join([_type(member, indent, defs) for member in schema["anyOf"]])
    if "enum" in schema:
        return _enum(schema)
    if "type" not in schema:
        if schema == {}:
            return "any"
        raise ValueError(f"Invalid JSON Schema object: {schema}")
    kind = schema["type"]
    if isinstance(kind, list):
        return " | ".join([_UNION_TYPES[member] for member in kind])
    if kind == "object":
        return _object(schema, indent, defs)
    if kind == "array":
        return _array(schema, indent, defs)
    return "number" if kind == "integer" else str(kind)


def _object(schema: dict[str, Any], indent: str, defs: _Defs) -> str:
    if not schema:
        return "{}"
    defs.schemas.update(schema.get("$defs") or {})
    inner = indent + _INDENT
    extra = schema.get("additionalProperties")
    extra_type = None if extra is None else _extra_type(extra, inner, defs)
    properties = schema.get("properties")
    fields = []
    if properties is not None:
        required = schema.get("required", [])
        # Rendered in schema order (so $defs register as met), shown required first by name.
        rendered = {n: _field(n, p, n not in required, inner, defs) for n, p in properties.items()}
        order = sorted(rendered, key=lambda name: (name not in required, name))
        fields = [rendered[name] for name in order]
    if extra_type is not None:
        fields.append(f"{inner}[k: string]: {extra_type}")
    if not fields:
        return "{}"
    return "{\n" + _FIELDS.join(fields) + "\n" + indent + "}"


def _extra_type(extra: Any, indent: str, defs: _Defs) -> str:
    """The value type of ``additionalProperties`` (true: any, false: never, or a schema)."""
    if extra is True:
        return "any"
    if extra is False:
        return "never"
    if isinstance(extra, dict):
        return _type(extra, indent, defs)
    raise ValueError(f"Unknown additionalProperties: {extra}")


def _array(schema: dict[str, Any], indent: str, defs: _Defs) -> str:
    item = schema.get("items") or {}
    inner = indent + _INDENT
    docstring = _docstring(item, inner)
    if docstring:
        return f"Array<\n{docstring}{inner}{_type(item, inner, defs)}\n{indent}>"
    return f"Array<{_type(item, indent, defs)}>"


def _enum(schema: dict[str, Any]) -> str:
    values = schema["enum"]
    kind = schema.get("type")
    if isinstance(kind, list):
        # One type, or one type and "null"; anything else the format cannot show.
        if len(kind) == 1:
            kind = kind[0]
        elif len(kind) == 2 and "null" in kind:
            kind = kind[0] if kind[0] != "null" else kind[1]
        else:
            raise ValueError(f"Enum type {kind} is not supported")
    checks: dict[Any, tuple[type, ...]] = {
        "string": (str,),
        "number": (int, float),
        "integer": (int,),
        "boolean": (bool,),
    }
    allowed = checks.get(kind)
    for value in values:
        if allowed is not None and value is not None and not isinstance(value, allowed):
            raise ValueError(f"Enum value {value} is not a {kind}")
    return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in values)
