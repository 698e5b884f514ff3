"""SmolLM2, Qwen2.5, Qwen3, Qwen3-Next/Thinking-2507, Qwen3.5, Qwen3-Coder, Llama 3.1/3.3 and
GLM-4.7 through the Renderer, with their REAL templates (llama.cpp's, from the llama-cpp-python
sdist, and miles' append-only variants) and Qwen's real vocabulary (qwen-agent's qwen.tiktoken,
added tokens at their real ids; GLM's and Llama's special tokens appended to it).

The conversations are miles' mock trajectories, replayed by the harness and scripted model of
``test_special_token_families`` (one machinery for every family): every sampled turn parses back
to the trajectory's calls, every later request extends the previous prompt + sampled ids exactly
(or is rendered whole where the family's reasoning policy says so), and, sampled canonically,
the spliced prompt equals the whole re-render token for token.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from artifacts import llama_cpp_template, qwen_tokenizer  # tests/artifacts.py
from polar.providers.types import NormalizedRequest, SamplingParams
from polar.rendering.families.registry import get_family
from polar.rendering.model_files import load_tokenizer
from polar.rendering.renderer import FRESH_REASONING_DROPPED, FRESH_TEMPLATE_GLUE, Renderer
from polar.rendering.turns import TurnBook

# The trajectory tests themselves, run here on this module's ``spec_renderer``.
from .test_special_token_families import (
    Sampler,
    Spec,
    _args,
    _dumps,
    miles_template,
    mt,
    test_detection_finds_each_family,  # noqa: F401
    test_every_later_prompt_extends_the_sampled_turn_exactly,  # noqa: F401
)

GLM_SPECIALS = (
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
LLAMA_SPECIALS = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _think(msg: dict[str, Any], opened: bool) -> str:
    reasoning = msg.get("reasoning_content")
    if reasoning is None:
        return ""
    return ("" if opened else "<think>\n") + f"{reasoning}\n</think>\n\n"


def _hermes_calls(sampler: Sampler, msg: dict[str, Any]) -> list[str]:
    calls = []
    for call in msg.get("tool_calls") or []:
        args = _dumps(_args(call), sampler.canonical)
        name = call["function"]["name"]
        body = (
            f'{{"name": "{name}", "arguments": {args}}}'
            if sampler.canonical
            else f'{{"arguments":{args},  "name":"{name}"}}'
        )
        calls.append(f"<tool_call>\n{body}\n</tool_call>")
    return calls


def _xml_calls(sampler: Sampler, msg: dict[str, Any]) -> list[str]:
    calls = []
    for call in msg.get("tool_calls") or []:
        args = list(_args(call).items())
        params = "".join(
            f"<parameter={k}>\n{_value(v)}\n</parameter>\n"
            for k, v in (args if sampler.canonical else reversed(args))
        )
        calls.append(f"<tool_call>\n<function={call['function']['name']}>\n{params}</function>\n")
    return [c + "</tool_call>" for c in calls]


def sample_hermes(sampler: Sampler, msg: dict[str, Any]) -> tuple[str, str]:
    """Qwen3: a <think> block first, then text and ``<tool_call>`` JSON calls."""
    content = msg.get("content") or ""
    calls = _hermes_calls(sampler, msg)
    text = "\n".join([content, *calls] if content else calls)
    return _think(msg, opened=False) + text, "<|im_end|>"


def sample_plain_hermes(sampler: Sampler, msg: dict[str, Any]) -> tuple[str, str]:
    """SmolLM2 / Qwen2.5: no reasoning."""
    return sample_hermes(sampler, {**msg, "reasoning_content": None})


def sample_thinking_hermes(sampler: Sampler, msg: dict[str, Any]) -> tuple[str, str]:
    """Qwen3-Next / Thinking-2507: the generation prompt already opened <think>."""
    text, end = sample_hermes(sampler, {**msg, "reasoning_content": None})
    return _think(msg, opened=True) + text, end


def sample_qwen35(sampler: Sampler, msg: dict[str, Any]) -> tuple[str, str]:
    content = msg.get("content") or ""
    calls = "\n".join(_xml_calls(sampler, msg))
    text = content + ("\n\n" if content and calls else "") + calls
    return _think(msg, opened=True) + text, "<|im_end|>"


def sample_qwen3_coder(sampler: Sampler, msg: dict[str, Any]) -> tuple[str, str]:
    content = (msg.get("content") or "").strip()
    calls = "\n".join(_xml_calls(sampler, msg))
    return content + ("\n\n" if content and calls else "") + calls, "<|im_end|>"


def sample_llama3(sampler: Sampler, msg: dict[str, Any]) -> tuple[str, str]:
    calls = msg.get("tool_calls") or []
    if not calls:
        return msg.get("content") or "", "<|eot_id|>"
    (call,) = calls
    args = _dumps(_args(call), sampler.canonical)
    name = call["function"]["name"]
    if sampler.canonical:
        return f'{{"name": "{name}", "parameters": {args}}}', "<|eot_id|>"
    return f'<|python_tag|>{{"parameters": {args}, "name": "{name}"}}', "<|eom_id|>"


def sample_glm47(sampler: Sampler, msg: dict[str, Any]) -> tuple[str, str]:
    text = f"{msg['reasoning_content']}</think>{(msg.get('content') or '').strip()}"
    for call in msg.get("tool_calls") or []:
        args = list(_args(call).items())
        gap = "" if sampler.canonical else "\n"
        text += f"<tool_call>{call['function']['name']}" + "".join(
            f"{gap}<arg_key>{k}</arg_key>{gap}<arg_value>{_value(v)}</arg_value>"
            for k, v in (args if sampler.canonical else reversed(args))
        )
        text += "</tool_call>"
    return text, "<|observation|>" if msg.get("tool_calls") else "<|user|>"


def _qwen(template: str) -> Any:
    return qwen_tokenizer(template)


SPECS: dict[str, tuple[Spec, Any]] = {
    "smollm2": (Spec("smollm2", lambda: None, (), sample_plain_hermes, always_thinks=False), None),
    "qwen2_5": (
        Spec(
            "qwen2_5",
            lambda: llama_cpp_template("Qwen-Qwen2.5-7B-Instruct.jinja"),
            (),
            sample_plain_hermes,
            always_thinks=False,
        ),
        "qwen",
    ),
    "qwen3": (
        Spec("qwen3", lambda: llama_cpp_template("Qwen-Qwen3-0.6B.jinja"), (), sample_hermes),
        "qwen",
    ),
    "qwen3_fixed": (
        Spec("qwen3", lambda: miles_template("qwen3_fixed.jinja"), (), sample_hermes),
        "qwen",
    ),
    "qwen3_next": (
        Spec(
            "qwen3_next",
            lambda: miles_template("qwen3_thinking_2507_and_next_fixed.jinja"),
            (),
            sample_thinking_hermes,
        ),
        "qwen",
    ),
    "qwen3_5": (
        Spec("qwen3_5", lambda: llama_cpp_template("Qwen3.5-4B.jinja"), (), sample_qwen35),
        "qwen",
    ),
    "qwen3_5_fixed": (
        Spec("qwen3_5", lambda: miles_template("qwen3.5_fixed.jinja"), (), sample_qwen35),
        "qwen",
    ),
    "qwen3_coder": (
        Spec(
            "qwen3_coder",
            lambda: llama_cpp_template("Qwen3-Coder.jinja"),
            (),
            sample_qwen3_coder,
            always_thinks=False,
        ),
        "qwen",
    ),
    "llama3_1": (
        Spec(
            "llama3",
            lambda: llama_cpp_template("meta-llama-Llama-3.1-8B-Instruct.jinja"),
            LLAMA_SPECIALS,
            sample_llama3,
            always_thinks=False,
            content_with_calls=False,
        ),
        "<|eot_id|>",
    ),
    "llama3_3": (
        Spec(
            "llama3",
            lambda: llama_cpp_template("meta-llama-Llama-3.3-70B-Instruct.jinja"),
            LLAMA_SPECIALS,
            sample_llama3,
            always_thinks=False,
            content_with_calls=False,
        ),
        "<|eot_id|>",
    ),
    "glm47": (
        Spec(
            "glm47", lambda: llama_cpp_template("GLM-4.7-Flash.jinja"), GLM_SPECIALS, sample_glm47
        ),
        "<|endoftext|>",
    ),
}


def build_tokenizer(key: str) -> Any:
    spec, eos = SPECS[key]
    if eos is None:
        return load_tokenizer()
    template = spec.template()
    extra = [(token, True) for token in spec.specials]
    return qwen_tokenizer(template, extra, eos="<|im_end|>" if eos == "qwen" else eos)


@pytest.fixture(scope="module", params=sorted(SPECS))
def spec_renderer(request: pytest.FixtureRequest) -> tuple[Spec, Renderer]:
    """The fixture the imported tests above run on here: this module's families."""
    spec, _ = SPECS[request.param]
    return spec, Renderer(build_tokenizer(request.param), get_family(spec.family))


def renderer_for(key: str, **overrides: Any) -> Renderer:
    spec, _ = SPECS[key]
    return Renderer(build_tokenizer(key), get_family(spec.family), **overrides)


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}


def _request(messages: list[dict[str, Any]], **params: Any) -> NormalizedRequest:
    return NormalizedRequest(
        provider="openai_chat",
        model="m",
        messages=copy.deepcopy(messages),
        tools=mt.WEATHER_TOOLS,
        params=SamplingParams(**params),
    )


def _turn(
    renderer: Renderer, book: TurnBook, history: list[dict[str, Any]], text: str, end: str | None
) -> tuple[list[int], list[int], dict[str, Any]]:
    """One sampled turn: its prompt, sampled ids (``end`` None: cut by length) and reply."""
    req = _request(history)
    plan = renderer.plan(book, req)
    ids = renderer.encode(text)
    if end is not None:
        ids.append(renderer.tokenizer.convert_tokens_to_ids(end))
    parsed, _ = renderer.parse(ids, req)
    calls = [c.id for c in parsed.tool_calls]
    renderer.remember(book, plan, f"c{len(history)}", plan.ids, ids, parsed.content, calls)
    reply: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        reply["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
    return plan.ids, ids, reply


USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("qwen3_5", "Checking.\n</think>\n\nIt is"),
        ("glm47", "Checking.</think>It is"),
        ("llama3_1", "It is"),
        ("qwen2_5", "It is"),
    ],
)
def test_a_turn_cut_by_length_or_a_stop_string_is_closed_by_the_template(
    key: str, text: str
) -> None:
    renderer = renderer_for(key, reasoning_history="keep")
    book = TurnBook()
    prompt, sampled, reply = _turn(renderer, book, USER, text, None)
    history = [*USER, reply, {"role": "user", "content": "Go on."}]
    plan = renderer.plan(book, _request(history))
    assert plan.spliced_from is not None, plan.fresh_reason
    assert plan.ids[: len(prompt) + len(sampled)] == prompt + sampled
    glue = renderer.decode(plan.ids[len(prompt) + len(sampled) :])
    close = renderer.family.history_end(renderer.turn_ends[renderer.eot_id])
    assert glue.startswith(close) or (key == "glm47" and glue.startswith("<|user|>"))


def test_glm_keeps_the_sampled_role_token_and_never_writes_it_twice() -> None:
    renderer = renderer_for("glm47", reasoning_history="keep")
    book = TurnBook()
    call = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    p1, s1, reply = _turn(renderer, book, USER, "Look.</think>" + call, "<|observation|>")
    result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "sunny"}
    history = [*USER, reply, result]
    p2, s2, answer = _turn(renderer, book, history, "Done.</think>Sunny.", "<|user|>")
    assert p2[: len(p1) + len(s1)] == p1 + s1
    tail = renderer.decode(p2[len(p1) + len(s1) :])
    assert tail.startswith("<tool_response>sunny") and "<|observation|>" not in tail
    history += [answer, {"role": "user", "content": "Thanks."}]
    plan = renderer.plan(book, _request(history))
    assert plan.spliced_from is not None and plan.keeps_dropped_reasoning
    tail = renderer.decode(plan.ids[len(p2) + len(s2) :])
    assert tail == "Thanks.<|assistant|><think>"


def test_a_turn_end_that_does_not_fit_what_follows_is_rendered_whole() -> None:
    """GLM sampled <|user|> after a call: history writes <|observation|> before the result,
    so the sampled token cannot be glued to the template's tail."""
    renderer = renderer_for("glm47")
    book = TurnBook()
    call = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    _, _, reply = _turn(renderer, book, USER, "Look.</think>" + call, "<|user|>")
    result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "sunny"}
    plan = renderer.plan(book, _request([*USER, reply, result]))
    assert plan.fresh_reason == FRESH_TEMPLATE_GLUE


@pytest.mark.parametrize("key", ["qwen3", "qwen3_5", "qwen3_next", "glm47"])
def test_reasoning_history_drop_renders_a_new_query_whole_and_keep_splices_it(key: str) -> None:
    spec, _ = SPECS[key]
    for policy in ("drop", "keep"):
        renderer = renderer_for(key, reasoning_history=policy)
        book = TurnBook()
        sampled = spec.sample(
            Sampler(canonical=True), {"reasoning_content": "Hm.", "content": "Hi."}
        )
        _, _, reply = _turn(renderer, book, USER, *sampled)
        history = [*USER, reply, {"role": "user", "content": "More?"}]
        plan = renderer.plan(book, _request(history))
        if policy == "drop":
            assert plan.fresh_reason == FRESH_REASONING_DROPPED
            assert plan.ids == renderer.encode(renderer.render(history, mt.WEATHER_TOOLS))
        else:
            assert plan.spliced_from is not None and plan.keeps_dropped_reasoning


def test_the_default_reasoning_policy_follows_the_template() -> None:
    assert {k: get_family(k).reasoning_history for k in ("qwen3", "glm47", "llama3")} == {
        "qwen3": "drop",
        "glm47": "drop",
        "llama3": "keep",
    }


def test_llama_parses_a_python_tag_call_decoded_with_special_tokens_kept() -> None:
    renderer = renderer_for("llama3_1")
    text, end = sample_llama3(Sampler(canonical=False), {"tool_calls": [CALL]})
    ids = [*renderer.encode(text), renderer.tokenizer.convert_tokens_to_ids(end)]
    parsed, _ = renderer.parse(ids, _request(USER))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert renderer.turn_ends[ids[-1]] == "<|eom_id|>"
