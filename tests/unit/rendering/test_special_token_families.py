"""Kimi K2.5, MiniMax M2.5/M2.7, DeepSeek V3.2, gpt-oss and Nemotron 3 through the Renderer.

Real templates and encoders from the installed/cached packages (miles-tito-tokenizers' templates
and DeepSeek encoder, llama.cpp's templates from the llama-cpp-python sdist), miles' mock
trajectories as the conversations, and a scripted model that samples each family's own format,
canonically or not (spaces, key order, split tokenizations). No vocabulary of these families
exists offline: their special tokens are added to SmolLM2's real vocabulary at fixed ids (the
splice and the parsers depend on template text and special tokens, not on BPE ranks).

Each conversation checks: every sampled turn parses back to the trajectory's calls, every later
request extends the previous prompt + sampled ids exactly (or is rendered whole where the
family's reasoning policy says so), and, sampled canonically, the spliced prompt equals the
whole re-render of the same history token for token.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from polar.errors import InvalidRequest
from polar.extras import EXTRA_MODULES, MissingExtra
from polar.providers.types import NormalizedRequest, SamplingParams
from polar.rendering.families.registry import detect_family, get_family
from polar.rendering.model_files import load_tokenizer, tokenizer_cache_path
from polar.rendering.renderer import FRESH_REASONING_DROPPED, PromptPlan, Renderer
from polar.rendering.turns import TurnBook

if importlib.util.find_spec("miles_tito_tokenizers") is None:
    pytest.skip("miles-tito-tokenizers (the test extra) is not installed", allow_module_level=True)

from miles_tito_tokenizers.testing import mock_trajectories as mt

from artifacts import llama_cpp_template, miles_path  # tests/artifacts.py, the shared cache

DS = "｜DSML｜"


def miles_template(name: str) -> str:
    return miles_path(f"templates/{name}").read_text("utf-8")


def family_tokenizer(template: str | None, specials: tuple[str, ...]) -> Any:
    """SmolLM2's real vocabulary plus a family's special tokens (ids 49152 on, in order)."""
    from transformers import AutoTokenizer

    load_tokenizer()  # fills the cache the first time
    tok = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": list(specials)})
    tok.chat_template = template
    return tok


# What each family's model samples for an assistant message (the scripted engine) -------------


def _args(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call["function"]["arguments"]
    return json.loads(arguments) if isinstance(arguments, str) else dict(arguments)


def _dumps(args: dict[str, Any], canonical: bool) -> str:
    if canonical:
        return json.dumps(args, ensure_ascii=False)
    return json.dumps(dict(reversed(list(args.items()))), separators=(",", ":"))


@dataclass
class Sampler:
    """Writes one assistant message the way the family's model samples it."""

    canonical: bool
    calls_made: int = 0

    def kimi(self, msg: dict[str, Any]) -> tuple[str, str]:
        pad = "" if self.canonical else " "
        calls = []
        for call in msg.get("tool_calls") or []:
            calls.append(
                f"<|tool_call_begin|>{pad}functions.{call['function']['name']}:{self.calls_made}"
                f"{pad}<|tool_call_argument_begin|>{_dumps(_args(call), self.canonical)}"
                "<|tool_call_end|>"
            )
            self.calls_made += 1
        text = f"{msg.get('reasoning_content') or ''}</think>{msg.get('content') or ''}"
        if calls:
            text += "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"
        return text, "<|im_end|>"

    def minimax(self, msg: dict[str, Any]) -> tuple[str, str]:
        text = f"{msg['reasoning_content']}\n</think>\n\n{msg.get('content') or ''}"
        if msg.get("tool_calls"):
            text += "\n<minimax:tool_call>\n"
            for call in msg["tool_calls"]:
                text += f'<invoke name="{call["function"]["name"]}">\n'
                for key, value in _args(call).items():
                    value = value if isinstance(value, str) else json.dumps(value)
                    text += f'<parameter name="{key}">{value}</parameter>\n'
                text += "</invoke>\n"
            text += "</minimax:tool_call>"
        return text, "[e~["

    def deepseek(self, msg: dict[str, Any]) -> tuple[str, str]:
        text = msg.get("content") or ""
        if msg.get("tool_calls"):
            invokes = []
            for call in msg["tool_calls"]:
                params = [
                    f'<{DS}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'
                    f"{v if isinstance(v, str) else json.dumps(v)}</{DS}parameter>"
                    for k, v in _args(call).items()
                ]
                invokes.append(
                    f'<{DS}invoke name="{call["function"]["name"]}">\n'
                    + "\n".join(params)
                    + f"\n</{DS}invoke>"
                )
            text += f"\n\n<{DS}function_calls>\n" + "\n".join(invokes) + f"\n</{DS}function_calls>"
        return text, "<｜end▁of▁sentence｜>"

    def deepseek_thinking(self, msg: dict[str, Any]) -> tuple[str, str]:
        text, end = self.deepseek(msg)
        return f"{msg['reasoning_content']}</think>{text}", end

    def gpt_oss(self, msg: dict[str, Any]) -> tuple[str, str]:
        text = f"<|channel|>analysis<|message|>{msg['reasoning_content']}<|end|><|start|>assistant"
        calls = msg.get("tool_calls") or []
        if not calls:
            return text + f"<|channel|>final<|message|>{msg.get('content') or ''}", "<|return|>"
        (call,) = calls
        name, args = call["function"]["name"], _dumps(_args(call), self.canonical)
        if self.canonical:  # the order the template writes back
            text += f" to=functions.{name}<|channel|>commentary json<|message|>{args}"
        else:  # the order the model is trained to sample
            text += f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"
        return text, "<|call|>"

    def nemotron(self, msg: dict[str, Any]) -> tuple[str, str]:
        content = msg.get("content") or ""
        text = f"{msg['reasoning_content']}\n</think>\n" + (content + "\n" if content else "")
        for call in msg.get("tool_calls") or []:
            text += f"<tool_call>\n<function={call['function']['name']}>\n"
            for key, value in _args(call).items():
                text += f"<parameter={key}>\n{value}\n</parameter>\n"
            text += "</function>\n</tool_call>\n"
        return (text if msg.get("tool_calls") else text.rstrip("\n")), "<|im_end|>"


@dataclass
class Spec:
    family: str
    template: Callable[[], str | None]
    specials: tuple[str, ...]
    sample: Callable[[Sampler, dict[str, Any]], tuple[str, str]]
    # Every turn reasons (the generation prompt opens the thought).
    always_thinks: bool = True
    # Call turns carry visible text (gpt-oss's template cannot render a preamble beside the
    # thought of a call turn, so its scripted model writes none).
    content_with_calls: bool = True


KIMI_SPECIALS = (
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
)
MINIMAX_SPECIALS = ("]~!b[", "]~b]", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>")
DEEPSEEK_SPECIALS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
)

GPT_OSS_SPECIALS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|endoftext|>",
)
NEMOTRON_SPECIALS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

SPECS = {
    "kimi_k25": Spec(
        "kimi_k2", lambda: miles_template("kimi_k25_fixed.jinja"), KIMI_SPECIALS, Sampler.kimi
    ),
    "minimax_m25": Spec(
        "minimax_m2",
        lambda: miles_template("minimax_m25_fixed.jinja"),
        MINIMAX_SPECIALS,
        Sampler.minimax,
    ),
    "minimax_m2_upstream": Spec(
        "minimax_m2",
        lambda: llama_cpp_template("MiniMax-M2.jinja"),
        MINIMAX_SPECIALS,
        Sampler.minimax,
    ),
    "minimax_m27": Spec(
        "minimax_m2",
        lambda: miles_template("minimax_m27_fixed.jinja"),
        MINIMAX_SPECIALS,
        Sampler.minimax,
    ),
    "gpt_oss": Spec(
        "gpt_oss",
        lambda: llama_cpp_template("openai-gpt-oss-120b.jinja"),
        GPT_OSS_SPECIALS,
        Sampler.gpt_oss,
        content_with_calls=False,
    ),
    "nemotron3": Spec(
        "nemotron3",
        lambda: llama_cpp_template("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja"),
        NEMOTRON_SPECIALS,
        Sampler.nemotron,
    ),
    "deepseek_v32": Spec(
        "deepseek_v32", lambda: None, DEEPSEEK_SPECIALS, Sampler.deepseek, always_thinks=False
    ),
    "deepseek_v32_thinking": Spec(
        "deepseek_v32_thinking", lambda: None, DEEPSEEK_SPECIALS, Sampler.deepseek_thinking
    ),
}

TRAJECTORIES = [
    mt.MultiTurnTrajectory,
    mt.ParallelToolsTrajectory,
    mt.LongChainTrajectory,
    mt.MultiUserToolChainTrajectory,
    mt.MultiTurnThinkingTrajectory,
    mt.LongChainThinkingTrajectory,
    mt.MultiUserTurnThinkingTrajectory,
    mt.SingleToolThinkingTrajectory,
]


@pytest.fixture(scope="module", params=sorted(SPECS))
def spec_renderer(request: pytest.FixtureRequest) -> tuple[Spec, Renderer]:
    spec = SPECS[request.param]
    tokenizer = family_tokenizer(spec.template(), spec.specials)
    return spec, Renderer(tokenizer, get_family(spec.family))


class Session:
    """A harness replaying a trajectory against the renderer with a scripted model."""

    def __init__(self, spec: Spec, renderer: Renderer, tools: Any, canonical: bool) -> None:
        self.spec, self.renderer, self.tools = spec, renderer, tools
        self.sampler = Sampler(canonical)
        self.book = TurnBook()
        self.history: list[dict[str, Any]] = []
        self.ids_by_trajectory_id: dict[str, str] = {}
        self.last: tuple[list[int], list[int]] | None = None
        self.spliced = 0
        self.rendered_whole_by_policy = 0
        self.whole_mismatches: list[int] = []

    def request(self) -> NormalizedRequest:
        return NormalizedRequest(
            provider="openai_chat",
            model="m",
            messages=copy.deepcopy(self.history),
            tools=self.tools or [],
            params=SamplingParams(),
        )

    def check_prompt(self, req: NormalizedRequest) -> PromptPlan:
        plan = self.renderer.plan(self.book, req)
        if self.last is not None:
            head = self.last[0] + self.last[1]
            if plan.fresh_reason == FRESH_REASONING_DROPPED:
                self.rendered_whole_by_policy += 1
            else:
                assert plan.spliced_from is not None, plan.fresh_reason
                assert plan.ids[: len(head)] == head
                self.spliced += 1
                whole = self.renderer.encode(self.renderer.render(req.messages, req.tools))
                if whole != plan.ids:
                    self.whole_mismatches.append(len(self.history))
        return plan

    def assistant(self, msg: dict[str, Any], step: int) -> None:
        msg = dict(msg)
        if self.spec.always_thinks and not msg.get("reasoning_content"):
            msg["reasoning_content"] = f"Step {step}: deciding."
        if msg.get("tool_calls") and not self.spec.content_with_calls:
            msg["content"] = None
        req = self.request()
        plan = self.check_prompt(req)
        prompt = plan.ids
        text, end = self.spec.sample(self.sampler, msg)
        ids = [*self.encode_sampled(text), self.renderer.tokenizer.convert_tokens_to_ids(end)]
        parsed, _ = self.renderer.parse(ids, req)
        expected = [(c["function"]["name"], _args(c)) for c in msg.get("tool_calls") or []]
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == expected
        assert parsed.content.strip() == (msg.get("content") or "").strip()
        if self.spec.always_thinks:
            assert parsed.reasoning == msg["reasoning_content"]
        self.renderer.remember(
            self.book,
            plan,
            f"c{step}",
            prompt,
            ids,
            parsed.content,
            [c.id for c in parsed.tool_calls],
        )
        self.last = (prompt, ids)
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            reply["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            reply["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in parsed.tool_calls
            ]
            for original, call in zip(msg["tool_calls"], parsed.tool_calls, strict=True):
                self.ids_by_trajectory_id[original["id"]] = call.id
        self.history.append(reply)

    def encode_sampled(self, text: str) -> list[int]:
        if self.sampler.canonical:
            return self.renderer.encode(text)
        cut = len(text) // 3  # a tokenization re-encoding would not give back
        return self.renderer.encode(text[:cut]) + self.renderer.encode(text[cut:])

    def other(self, msg: dict[str, Any]) -> None:
        msg = dict(msg)
        if msg.get("tool_call_id"):
            msg["tool_call_id"] = self.ids_by_trajectory_id[msg["tool_call_id"]]
        self.history.append(msg)


def replay(spec: Spec, renderer: Renderer, trajectory: Any, canonical: bool) -> Session:
    session = Session(spec, renderer, trajectory.TOOLS, canonical)
    for step, msg in enumerate(copy.deepcopy(trajectory.MESSAGES)):
        if msg["role"] == "assistant":
            session.assistant(msg, step)
        else:
            session.other(msg)
    if session.history[-1]["role"] != "assistant":
        session.check_prompt(session.request())
    return session


@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "non_canonical"])
@pytest.mark.parametrize("trajectory", TRAJECTORIES, ids=lambda t: t.__name__)
def test_every_later_prompt_extends_the_sampled_turn_exactly(
    spec_renderer: tuple[Spec, Renderer], trajectory: Any, canonical: bool
) -> None:
    spec, renderer = spec_renderer
    if not renderer.family.features.parallel_tool_calls and trajectory in PARALLEL:
        pytest.skip(f"{spec.family} renders one call per turn")
    session = replay(spec, renderer, trajectory, canonical=canonical)
    assert session.spliced + session.rendered_whole_by_policy >= 1
    if canonical:  # the template writes back exactly what the model sampled
        assert session.whole_mismatches == []


PARALLEL = (mt.ParallelToolsTrajectory, mt.MultiToolSingleTurnTrajectory)


def test_detection_finds_each_family(spec_renderer: tuple[Spec, Renderer]) -> None:
    spec, renderer = spec_renderer
    found = detect_family(renderer.tokenizer)
    if spec.family.startswith("deepseek_v32"):  # no template: a V3.2 config.json says so
        assert found is None or found.name != "deepseek_v32"
    else:
        assert found is not None and found.name == spec.family


def renderer_for(key: str) -> Renderer:
    spec = SPECS[key]
    return Renderer(family_tokenizer(spec.template(), spec.specials), get_family(spec.family))


def test_kimi_history_names_results_by_the_models_own_ids() -> None:
    renderer = renderer_for("kimi_k25")
    session = replay(SPECS["kimi_k25"], renderer, mt.MultiTurnTrajectory, canonical=True)
    assert list(session.ids_by_trajectory_id.values()) == [
        "functions.get_weather:0",
        "functions.get_weather:1",
    ]
    prompt = renderer.render(session.history, mt.MultiTurnTrajectory.TOOLS)
    assert "## Return of functions.get_weather:0\n" in prompt
    assert "## Return of functions.get_weather:1\n" in prompt


@pytest.mark.parametrize("key", ["deepseek_v32", "deepseek_v32_thinking"])
def test_deepseek_renders_with_the_official_encoder(key: str) -> None:
    from miles_tito_tokenizers.encoders.deepseek_v32 import render_messages

    renderer = renderer_for(key)
    trajectory = mt.LongChainThinkingTrajectory
    messages = copy.deepcopy(trajectory.MESSAGES)
    for m in messages:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    mode = "thinking" if key.endswith("thinking") else "chat"
    expected = render_messages(messages, tools=trajectory.TOOLS, thinking_mode=mode)
    assert renderer.render(trajectory.MESSAGES, trajectory.TOOLS) == expected
    assert expected.endswith("<think>" if mode == "thinking" else "</think>")


def test_deepseek_refuses_a_prefill_and_names_a_missing_encoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renderer = renderer_for("deepseek_v32")
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "He"}]
    with pytest.raises(InvalidRequest, match="cannot continue"):
        renderer.render(prefill, None, continue_final=True)
    monkeypatch.setitem(EXTRA_MODULES, "deepseek", ("polar_test_absent_module",))
    with pytest.raises(MissingExtra, match=r"pip install 'polar\[deepseek\]'"):
        Renderer(renderer.tokenizer, get_family("deepseek_v32"))


def test_deepseek_is_detected_from_a_v32_checkpoint(tmp_path: Any) -> None:
    tokenizer = renderer_for("deepseek_v32").tokenizer
    assert detect_family(tokenizer) is None
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v32"}))
    from transformers import AutoTokenizer

    found = detect_family(AutoTokenizer.from_pretrained(str(tmp_path)))
    assert found is not None and found.name == "deepseek_v32"


@pytest.mark.parametrize(
    ("key", "sample"),
    [
        ("nemotron3", Sampler.nemotron),
        ("deepseek_v32", Sampler.deepseek),
        ("deepseek_v32_thinking", Sampler.deepseek_thinking),
        ("minimax_m25", Sampler.minimax),
    ],
)
def test_family_call_patterns_accept_what_the_model_samples(
    key: str, sample: Callable[[Sampler, dict[str, Any]], tuple[str, str]]
) -> None:
    import re

    family = get_family(SPECS[key].family)
    turn = copy.deepcopy(mt.ParallelToolsTrajectory.MESSAGES[2])
    turn["reasoning_content"] = "Three cities."
    text, _ = sample(Sampler(canonical=True), turn)
    functions = [t["function"] for t in mt.WEATHER_TOOLS]
    pattern = family.call_pattern(functions, True)
    assert pattern is not None and re.fullmatch(pattern, text)
    single = family.call_pattern(functions, False)
    assert single is not None and not re.fullmatch(single, text)


def test_special_token_call_formats_are_refused_by_name() -> None:
    functions = [t["function"] for t in mt.WEATHER_TOOLS]
    assert get_family("kimi_k2").call_pattern(functions, True) is None
    assert get_family("gpt_oss").call_pattern(functions, True) is None


@pytest.mark.parametrize("key", ["kimi_k25", "minimax_m25", "gpt_oss", "nemotron3"])
def test_keeping_reasoning_splices_past_a_new_user_turn_where_the_template_drops_it(
    key: str,
) -> None:
    spec = SPECS[key]
    tokenizer = family_tokenizer(spec.template(), spec.specials)
    renderer = Renderer(tokenizer, get_family(spec.family), reasoning_history="keep")
    session = replay(spec, renderer, mt.MultiUserTurnThinkingTrajectory, canonical=True)
    assert session.rendered_whole_by_policy == 0 and session.spliced == 3
    # The splice carries the thought the template drops once a new user turn follows.
    assert session.whole_mismatches


def test_gpt_oss_call_turn_with_a_preamble_and_a_thought_still_renders() -> None:
    renderer = renderer_for("gpt_oss")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Need the tool.",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    prompt = renderer.render(history, mt.WEATHER_TOOLS)
    assert "<|channel|>analysis<|message|>Need the tool.<|end|>" in prompt
    assert prompt.endswith('commentary<|message|>"sunny"<|end|><|start|>assistant')
