"""vLLM's chat preprocessing: what ``/v1/chat/completions`` does to messages before the template.

A prompt the gateway renders whole must be byte-identical to what vLLM would feed the model for
the same chat request, so the same steps run first (facts from vLLM's ``chat_utils``):

* the template's content format is detected from its Jinja AST: ``openai`` when it loops over
  a message's ``content`` (``{% for part in message.content %}``), else ``string``;
* ``string``: text parts are joined with ``"\\n"``, null content is ``""``; ``openai``: content
  is a list of ``{"type": "text", "text": ...}`` parts (a string is one part, null is none);
* a tool message's text parts are always joined into one string;
* an assistant message's empty ``tool_calls`` is dropped, and each call's ``arguments`` is
  parsed to an object (empty, malformed or non-object JSON becomes ``{}``);
* ``reasoning`` is passed as both ``reasoning`` and ``reasoning_content``; a null
  ``tool_calls`` is dropped.

Non-text parts never reach here: the gateway refuses them by name before rendering.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Literal

ContentFormat = Literal["string", "openai"]


@cache
def content_format(template: str) -> ContentFormat:
    """``openai`` when the template iterates over a message's content, else ``string``."""
    import jinja2
    from jinja2 import nodes

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    try:
        tree = env.parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    loops = list(tree.find_all(nodes.For))
    message_vars = {
        loop.target.name
        for loop in loops
        if isinstance(loop.target, nodes.Name) and _accesses(loop.iter, "messages", None)
    }
    for loop in loops:
        if any(_accesses(loop.iter, name, "content") for name in message_vars):
            return "openai"
    return "string"


def _accesses(node: Any, name: str, key: str | None) -> bool:
    """Whether ``node`` is ``name`` (``key`` None; slices and filters allowed) or
    ``name.key`` / ``name['key']``."""
    from jinja2 import nodes

    while isinstance(node, nodes.Filter | nodes.Test) and node.node is not None:
        node = node.node
    if key is None:
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        return isinstance(node, nodes.Name) and node.name == name
    if isinstance(node, nodes.Getattr):
        return node.attr == key and _accesses(node.node, name, None)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return node.arg.value == key and _accesses(node.node, name, None)
    return False


def conversation(messages: list[dict[str, Any]], fmt: ContentFormat) -> list[dict[str, Any]]:
    """``messages`` as vLLM hands them to a chat template of content format ``fmt``.

    vLLM copies only the fields it knows; other fields are kept here, since a family may add
    its own for its template (gpt-oss's ``thinking``) and providers write no others.
    """
    out = []
    for source in messages:
        message = {k: v for k, v in source.items() if k not in ("tool_calls", "reasoning")}
        texts = _texts(source.get("content"))
        if source.get("role") == "tool" or fmt == "string":
            message["content"] = "\n".join(texts)
        else:
            message["content"] = [{"type": "text", "text": text} for text in texts]
        if source.get("role") == "assistant":
            _assistant(source, message)
        out.append(message)
    return out


def _texts(content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("text") is not None:
            texts.append(str(part["text"]))
    return texts


def _assistant(source: dict[str, Any], message: dict[str, Any]) -> None:
    calls = source.get("tool_calls")
    if isinstance(calls, list) and calls:
        message["tool_calls"] = [_with_object_arguments(call) for call in calls]
    reasoning = source.get("reasoning", source.get("reasoning_content"))
    if reasoning is not None:
        message["reasoning"] = message["reasoning_content"] = reasoning


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError:
            arguments = {}
    function["arguments"] = arguments if isinstance(arguments, dict) else {}
    return {**call, "function": function}
