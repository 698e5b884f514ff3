"""Gateway-side rendering on SmolLM2's real tokenizer and Polar's tool-aware template."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.providers.types import NormalizedRequest, SamplingParams
from polar.rendering.chat_template import render_prompt
from polar.rendering.families.registry import get_family
from polar.rendering.model_files import load_tokenizer
from polar.rendering.renderer import (
    FRESH_HISTORY_CHANGED,
    FRESH_NO_ASSISTANT_TURN,
    FRESH_UNKNOWN_TURN,
    Renderer,
)
from polar.rendering.turns import TurnBook
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from ..trajectory.sessions import record

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(load_tokenizer(), get_family("smollm2"))


def request(messages: list[dict[str, Any]], **params: Any) -> NormalizedRequest:
    return NormalizedRequest(
        provider="openai_chat",
        model="m",
        messages=messages,
        tools=TOOLS,
        params=SamplingParams(**params),
    )


def noncanonical_ids(renderer: Renderer, text: str) -> list[int]:
    """The text in two separately tokenized halves: what a model may sample, and re-encoding
    does not give back."""
    half = len(text) // 2
    return renderer.encode(text[:half]) + renderer.encode(text[half:])


class Harness:
    """Plays a harness against the renderer: sends history, gets a parsed reply back."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.book = TurnBook()
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Fix the build."},
        ]
        self.records: list[Any] = []

    def call(self, sampled_text: str, *, split: bool, length_stop: bool = False) -> Any:
        req = request(list(self.messages))
        plan = self.renderer.plan(self.book, req)
        ids = (
            noncanonical_ids(self.renderer, sampled_text)
            if split
            else self.renderer.encode(sampled_text)
        )
        if not length_stop:
            ids.append(self.renderer.eot_id)
        parsed, _ = self.renderer.parse(ids, req)
        rec = record(plan.ids, ids, finish="length" if length_stop else "stop")
        self.renderer.remember(
            self.book,
            plan,
            rec.completion_id,
            plan.ids,
            ids,
            parsed.content,
            [c.id for c in parsed.tool_calls],
        )
        self.records.append(rec)
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            # Harnesses keep parsed arguments and re-serialize them their own way.
            reply["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "arguments": json.dumps(json.loads(c.arguments), separators=(",", ":")),
                    },
                }
                for c in parsed.tool_calls
            ]
        self.messages.append(reply)
        for c in parsed.tool_calls:
            self.messages.append({"role": "tool", "tool_call_id": c.id, "content": "exit 0"})
        if not parsed.tool_calls:
            self.messages.append({"role": "user", "content": "Go on."})
        return plan


PRETTY_CALL = '<tool_call>\n{\n    "name": "bash",\n    "arguments": {"command": "make  -j2"}\n}\n</tool_call>'


def test_a_continuing_request_extends_the_sampled_ids_exactly(renderer: Renderer) -> None:
    harness = Harness(renderer)
    first = harness.call("Let me build.\n" + PRETTY_CALL, split=True)
    second = harness.call("The build passes now.", split=True)
    assert first.fresh_reason == FRESH_NO_ASSISTANT_TURN
    assert second.spliced_from == harness.records[0].completion_id
    r1, r2 = harness.records
    assert (
        r2.prompt_ids[: len(r1.prompt_ids) + len(r1.sampled_ids)] == r1.prompt_ids + r1.sampled_ids
    )
    # The rest is what the template renders after the turn: the tool result and the glue.
    tail = renderer.decode(r2.prompt_ids[len(r1.prompt_ids) + len(r1.sampled_ids) :])
    assert "exit 0" in tail and tail.endswith("assistant\n")
    # Re-rendering the same history would NOT have reproduced the sampled turn.
    whole = render_prompt(renderer.tokenizer, harness.messages[:4], TOOLS).ids
    assert whole != r2.prompt_ids


def test_a_length_stopped_turn_is_closed_by_the_template(renderer: Renderer) -> None:
    harness = Harness(renderer)
    harness.call("I think the answer is", split=False, length_stop=True)
    harness.call("Done.", split=False)
    r1, r2 = harness.records
    glue = r2.prompt_ids[len(r1.prompt_ids) + len(r1.sampled_ids)]
    assert glue == renderer.eot_id


def test_changed_history_and_unknown_turns_are_rendered_whole(renderer: Renderer) -> None:
    harness = Harness(renderer)
    harness.call("Let me build.\n" + PRETTY_CALL, split=True)
    edited = list(harness.messages)
    edited[1] = {"role": "user", "content": "Fix the tests instead."}
    assert renderer.plan(harness.book, request(edited)).fresh_reason == FRESH_HISTORY_CHANGED
    foreign = [*harness.messages[:2], {"role": "assistant", "content": "I never said this."}]
    assert renderer.plan(harness.book, request(foreign)).fresh_reason == FRESH_UNKNOWN_TURN


def test_parse_gives_tool_calls_only_when_tools_may_be_called(renderer: Renderer) -> None:
    ids = [*renderer.encode("Building.\n" + PRETTY_CALL), renderer.eot_id]
    parsed, _ = renderer.parse(ids, request([{"role": "user", "content": "x"}]))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("bash", {"command": "make  -j2"})
    ]
    assert parsed.content == "Building."
    no_tools = request([{"role": "user", "content": "x"}])
    no_tools.tool_choice = "none"
    parsed, _ = renderer.parse(ids, no_tools)
    assert parsed.tool_calls == [] and "<tool_call>" in parsed.content


def test_stop_strings_cut_the_reply_text(renderer: Renderer) -> None:
    ids = renderer.encode("Answer: 42\nObservation: none")
    parsed, stop = renderer.parse(ids, request([{"role": "user", "content": "x"}], stop=["Obs"]))
    assert (parsed.content, stop) == ("Answer: 42\n", "Obs")


WORDS = ["make", "test", "fix", "the", "build", "now", "ok", "é", "日本"]
step = st.fixed_dictionaries(
    {
        "words": st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
        "tool": st.booleans(),
        "split": st.booleans(),
        "pretty": st.booleans(),
    }
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(step, min_size=1, max_size=6))
def test_sessions_with_random_drift_are_one_exact_trace(renderer: Renderer, steps: list) -> None:
    harness = Harness(renderer)
    for s in steps:
        text = " ".join(s["words"])
        if s["tool"]:
            args = {"command": text}
            body = json.dumps(
                {"name": "bash", "arguments": args}, indent=4 if s["pretty"] else None
            )
            text = f"{text}\n<tool_call>\n{body}\n</tool_call>"
        harness.call(text, split=s["split"])
    trajectory = PrefixMergingBuilder().build(harness.records)
    meta = trajectory.metadata
    assert meta["num_traces"] == 1, meta["breaks"]
    assert meta["merged_calls"] == meta["context_exact_calls"] == len(steps) - 1


def test_a_template_that_drops_past_reasoning_still_gives_one_exact_trace() -> None:
    """Qwen3's template strips reasoning from turns before the latest user query, so an
    engine re-rendering history rewrites what was sampled; splicing never re-renders it."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from polar.rendering.model_files import tokenizer_cache_path

    tok = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    tok.add_tokens(["<think>", "</think>"])  # added, not special: decoding keeps them, as Qwen3
    template = Path(__file__).parents[1] / "trajectory" / "qwen3_chat_template.jinja"
    tok.chat_template = template.read_text()
    qwen = Renderer(
        tok, get_family("qwen3"), chat_template=template.read_text(), reasoning_history="keep"
    )
    harness = Harness(qwen)
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    harness.call("<think>\nI should look first.\n</think>\n\n" + call, split=True)
    harness.call("<think>\nThe listing is fine.\n</think>\n\nAll good.", split=False)
    harness.call("<think>\nAnother query.\n</think>\n\nDone again.", split=True)
    trajectory = PrefixMergingBuilder().build(harness.records)
    assert trajectory.metadata["num_traces"] == 1, trajectory.metadata["breaks"]
    assert trajectory.metadata["context_exact_calls"] == 2
    # What an engine-side rendering of the same history gives instead (reasoning dropped):
    last = harness.records[-1]
    history = [*harness.messages[:-2]]
    history[2] = {**history[2], "reasoning": "I should look first."}
    assert render_prompt(tok, history, TOOLS).ids != last.prompt_ids
