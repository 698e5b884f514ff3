"""vLLM's chat preprocessing, as the gateway repeats it before rendering a prompt whole."""

from __future__ import annotations

from artifacts import llama_cpp_template  # tests/artifacts.py
from polar.rendering.chat_template import render_text
from polar.rendering.model_files import load_tokenizer
from polar.rendering.vllm_chat import content_format, conversation


def test_the_content_format_is_read_from_the_template_like_vllm() -> None:
    # GLM-4.7 loops over a tool message's content: vLLM hands it content parts.
    assert content_format(llama_cpp_template("GLM-4.7-Flash.jinja")) == "openai"
    # Qwen3.5 loops over content only inside a macro: vLLM's AST walk does not see it.
    assert content_format(llama_cpp_template("Qwen3.5-4B.jinja")) == "string"
    assert content_format(llama_cpp_template("Qwen-Qwen3-0.6B.jinja")) == "string"
    nested = "{% for m in messages %}{% for p in m['content'] %}{% endfor %}{% endfor %}"
    assert content_format(nested) == "openai"
    assert content_format("{% for p in other.content %}{% endfor %}") == "string"


MESSAGES = [
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {
        "role": "assistant",
        "content": None,
        "reasoning": "think",
        "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": ""}},
            {"id": "3", "type": "function", "function": {"name": "h", "arguments": "{broken"}},
        ],
    },
    {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "r1"}] * 2},
    {"role": "assistant", "content": "ok", "tool_calls": []},
]


def test_string_format_joins_parts_and_parses_arguments() -> None:
    user, call, tool, answer = conversation(MESSAGES, "string")
    assert user["content"] == "a\nb"
    assert call["content"] == ""
    assert call["reasoning"] == call["reasoning_content"] == "think"
    assert [c["function"]["arguments"] for c in call["tool_calls"]] == [{"x": 1}, {}, {}]
    assert tool == {"role": "tool", "tool_call_id": "1", "content": "r1\nr1"}
    assert "tool_calls" not in answer  # vLLM drops an empty list (Llama checks the key)


def test_openai_format_keeps_text_parts_but_joins_tool_results() -> None:
    user, call, tool, answer = conversation(MESSAGES, "openai")
    assert user["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert call["content"] == []
    assert tool["content"] == "r1\nr1"
    assert answer["content"] == [{"type": "text", "text": "ok"}]


def test_a_whole_render_sees_the_preprocessed_conversation() -> None:
    text = render_text(load_tokenizer(), MESSAGES[:3], None)
    assert "a\nb" in text and '"arguments": {"x": 1}' in text and "r1\nr1" in text
