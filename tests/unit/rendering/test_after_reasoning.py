"""A forced call's grammar under an engine reasoning parser (vLLM applies it only once the
reasoning has ended): the pattern that starts there, and when the prompt already ended it."""

from __future__ import annotations

import re

from polar.rendering.call_patterns import WS, after_reasoning, reasoning_ended
from polar.rendering.families.registry import get_family

BASH = {
    "name": "bash",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}
CALLS = {
    "qwen3": '\n\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>',
    "qwen3_5": "\n<tool_call>\n<function=bash>\n</function>\n</tool_call>",
    "nemotron3": "\n<tool_call>\n<function=bash>\n</function>\n</tool_call>\n",
    "minimax_m2": '\n<minimax:tool_call>\n<invoke name="bash">\n</invoke>\n</minimax:tool_call>',
}


def test_the_pattern_after_reasoning_is_the_calls_without_the_thought() -> None:
    for name, text in CALLS.items():
        full = get_family(name).call_pattern([BASH], False)
        assert full is not None
        after = after_reasoning(full)
        assert after.startswith(WS) and "think>" not in after.removeprefix(WS)[:40], name
        assert re.fullmatch(after, text), (name, after)
        assert not re.fullmatch(after, "<think>x</think>" + text), name
    hermes = get_family("qwen2_5").call_pattern([BASH], False)
    assert hermes is not None and after_reasoning(hermes) == WS + hermes


def test_the_prompt_ends_the_reasoning_when_its_last_think_tag_closes_it() -> None:
    start, end = 7, 8
    assert not reasoning_ended([1, 2, 3], start, end)
    assert reasoning_ended([1, start, 4, end, 5], start, end)
    assert not reasoning_ended([1, start, 4, end, 5, start, 6], start, end)
