"""Chat messages to the text and prompt ids the model sees.

Rendering follows vLLM: the chat template renders text, which is then tokenized without
adding special tokens, so the embedded engine's and the gateway's prompt ids equal vLLM's for
the same request. Templates without tool support get tools and past tool calls rendered as
Hermes-style text by :mod:`polar.rendering.tool_text`; templates with tool support receive them
natively. SmolLM2 is served with Polar's tool-aware template (``templates/smollm2_tools.jinja``),
which renders exactly what that fallback did, so vLLM can serve it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from polar.errors import InvalidRequest
from polar.rendering import vllm_chat
from polar.rendering.tool_text import (
    messages_for_plain_template,
    template_supports_tools,
)
from polar.rendering.vllm_chat import content_format

ROLES = ("system", "developer", "user", "assistant", "tool")


SMOLLM2_TOOLS_TEMPLATE = "smollm2_tools"


@cache
def bundled_template(name: str) -> str:
    """A chat template shipped with Polar (``templates/<name>.jinja``)."""
    return (files("polar.rendering") / "templates" / f"{name}.jinja").read_text("utf-8")


@dataclass
class RenderedPrompt:
    text: str
    ids: list[int]


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final: bool = False,
) -> RenderedPrompt:
    """The exact prompt the model sees for ``messages`` (and ``tools``)."""
    text = render_text(
        tokenizer,
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        continue_final=continue_final,
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return RenderedPrompt(text, list(ids))


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    continue_final: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The chat template's text for ``messages`` (and ``tools``), before tokenization.

    ``chat_template`` replaces the tokenizer's own template when given. ``continue_final``
    leaves the final (assistant) message open for the model to continue, with no generation
    prompt after it (an assistant prefill). ``template_kwargs`` are extra template variables a
    family's tokenizer code passes (Kimi's ``tools_ts_str``).
    """
    from jinja2 import TemplateError

    validate_messages(messages)
    template = chat_template or tokenizer.chat_template
    if template_supports_tools(template):
        fmt = content_format(template)
        conversation, template_tools = vllm_chat.conversation(messages, fmt), tools or None
    else:
        conversation, template_tools = messages_for_plain_template(messages, tools), None
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tools=template_tools,
            add_generation_prompt=add_generation_prompt and not continue_final,
            continue_final_message=continue_final,
            tokenize=False,
            chat_template=template,
            **(template_kwargs or {}),
        )
    except TemplateError as exc:
        raise InvalidRequest(f"the chat template rejected these messages: {exc}") from exc
    return str(text)


def validate_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequest(f"messages[{i}] must be an object")
        if msg.get("role") not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        for j, call in enumerate(msg.get("tool_calls") or []):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise InvalidRequest(f"messages[{i}].tool_calls[{j}].function.name is required")
