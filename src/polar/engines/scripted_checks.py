"""What a strict engine's constrained decoding guarantees, checked on a scripted reply.

vLLM samples only output that matches a requested JSON schema, regex or forced tool call; a
scripted reply that would not is a script error, answered as a 400 rather than sent on as if
constrained. Apart from the backend because it is its own small JSON Schema reader.
"""

from __future__ import annotations

import json
import re
from typing import Any

from polar.engines.scripted_script import ScriptedReply
from polar.errors import EngineRefusal


def chat_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a chat body's ``response_format`` asks for (``{}`` for any JSON object)."""
    spec = body.get("response_format")
    if not isinstance(spec, dict) or spec.get("type") in (None, "text"):
        return None
    if spec.get("type") == "json_schema":
        return dict((spec.get("json_schema") or {}).get("schema") or {})
    return {"type": "object"}


def token_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a token prompt's ``structured_outputs`` asks for (vLLM's shape)."""
    spec = body.get("structured_outputs")
    if not isinstance(spec, dict):
        return None
    if isinstance(spec.get("json"), dict):
        return dict(spec["json"])
    return {"type": "object"} if spec.get("json_object") else None


def token_regex(body: dict[str, Any]) -> re.Pattern[str] | None:
    """The regex a token prompt's ``structured_outputs`` asks for; a broken one is a 400."""
    spec = body.get("structured_outputs")
    pattern = spec.get("regex") if isinstance(spec, dict) else None
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise EngineRefusal(400, "structured_outputs.regex must be a string")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise EngineRefusal(
            400, f"Invalid regular expression in structured_outputs: {exc}"
        ) from exc


def check_regex(pattern: re.Pattern[str], text: str) -> None:
    """A constrained engine samples only text the regex matches whole; a scripted reply that
    does not is a script error, answered as one rather than sent on as if constrained."""
    if pattern.fullmatch(text) is None:
        raise EngineRefusal(
            400, f"structured output: the scripted reply {text[:80]!r} does not match the regex"
        )


def check_tool_choice(choice: Any, reply: ScriptedReply) -> None:
    """vLLM's chat endpoint forces a call for ``required`` or a named function (guided
    decoding); a scripted reply that would break that is a script error."""
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if choice != "required" and named is None:
        return
    if not reply.tool_calls or (named and any(n != named for n, _ in reply.tool_calls)):
        raise EngineRefusal(
            400, f"structured output: the scripted reply does not honour tool_choice {choice!r}"
        )


def check_structured_output(schema: dict[str, Any] | None, reply: ScriptedReply) -> None:
    """A strict engine's output always matches the schema it was given; a scripted reply that
    would not is a script error, answered as one rather than sent on as if constrained."""
    if schema is None or reply.error_status:
        return
    try:
        value = json.loads(reply.content)
    except json.JSONDecodeError as exc:
        raise EngineRefusal(
            400, f"structured output: the scripted reply is not JSON ({exc})"
        ) from exc
    problem = _schema_problem(value, schema, "$")
    if problem:
        raise EngineRefusal(400, f"structured output: the scripted reply {problem}")


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _schema_problem(value: Any, schema: dict[str, Any], at: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (type, enum, required, properties, items,
    additionalProperties: false), or None; enough JSON Schema for scripted replies."""
    kinds = schema.get("type")
    if isinstance(kinds, str):
        kinds = [kinds]
    if isinstance(kinds, list):
        is_bool = isinstance(value, bool)
        if not any(
            isinstance(value, _JSON_TYPES.get(k, ())) and (k == "boolean" or not is_bool)
            for k in kinds
        ):
            return f"has {at} that is not of type {'/'.join(kinds)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"has {at} outside its enum"
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                return f"lacks the required {at}.{name}"
        for name, item in value.items():
            if name in properties:
                problem = _schema_problem(item, properties[name], f"{at}.{name}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"has {at}.{name}, which the schema does not allow"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = _schema_problem(item, schema["items"], f"{at}[{i}]")
            if problem:
                return problem
    return None
