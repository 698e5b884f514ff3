"""Per-family pieces of the family x real-CLI matrix: a test tokenizer, a reference rendering
and a sampler that writes the family's own format NON-canonically.

* The **test tokenizer** of a family is a real vocabulary (SmolLM2's 49,152-token BPE) with the
  family's special and markup tokens added and the family's published chat template (from the
  llama-cpp-python sdist or the miles-tito-tokenizers wheel, through tests/artifacts.py;
  nothing is copied into the repository). Splicing and parsing
  depend on template text and special tokens, not on BPE ranks.
* The **reference rendering** is what vLLM's chat endpoint feeds the model: its chat
  preprocessing (content parts joined, null content as "", tool-call arguments parsed back to
  objects, past reasoning passed as ``reasoning``/``reasoning_content``), then the family's
  template with tools and the generation prompt. The engine's ``/tokenize`` answers with it, so
  every whole prompt the gateway renders is checked against it.
* The **sampler** writes what the model would emit for a scripted reply, in the family's call
  format (chosen by its tool parser) but not as its template would re-render it: JSON keys in
  reverse order and pretty-printed, parameters reversed, reasoning first where the family thinks,
  and the ids of one piece of text split so re-encoding would not give them back.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from artifacts import (  # tests/artifacts.py, the shared cache
    kimi_reference_encoder,
    llama_cpp_template,
    miles_path,
)
from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.scripted import ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.rendering.families.base import Family
from polar.rendering.families.kimi_tools_ts import deep_sorted
from polar.rendering.model_files import tokenizer_cache_path


@dataclass(frozen=True)
class TokenizerRecipe:
    """How to dress SmolLM2's vocabulary as a family's tokenizer."""

    template: str | None  # llama.cpp template file name, "miles:<file>", or None: the vocab's own
    specials: tuple[str, ...] = ()
    plain: tuple[str, ...] = ()  # added tokens that are not special (Qwen's <tool_call>)
    eos: str | None = None
    bos: str | None = None
    model_type: str | None = None  # a checkpoint directory with no template, this config type


_QWEN_PLAIN = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_THINK = ("<think>", "</think>")
_LLAMA = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
_GLM = (
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|endoftext|>",
    *_THINK,
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
)

RECIPES: dict[str, TokenizerRecipe] = {
    "smollm2": TokenizerRecipe(None),
    "qwen2_5": TokenizerRecipe("Qwen-Qwen2.5-7B-Instruct.jinja", plain=_QWEN_PLAIN),
    "qwen3": TokenizerRecipe("Qwen-Qwen3-0.6B.jinja", plain=_QWEN_PLAIN + _THINK),
    "qwen3_coder": TokenizerRecipe("Qwen3-Coder.jinja", plain=_QWEN_PLAIN),
    "qwen3_5": TokenizerRecipe("Qwen3.5-4B.jinja", plain=_QWEN_PLAIN + _THINK),
    "llama3": TokenizerRecipe(
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        specials=_LLAMA,
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
    ),
    "glm47": TokenizerRecipe("GLM-4.7-Flash.jinja", specials=_GLM, eos="<|endoftext|>"),
    "qwen3_next": TokenizerRecipe(
        "miles:qwen3_thinking_2507_and_next_fixed.jinja", plain=_QWEN_PLAIN + _THINK
    ),
    "nemotron3": TokenizerRecipe(
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
        specials=(*_THINK, "<tool_call>", "</tool_call>"),
        plain=("<tool_response>", "</tool_response>"),
    ),
    "kimi_k2": TokenizerRecipe(
        "miles:kimi_k25_fixed.jinja",
        specials=(
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "[EOS]",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
            *_THINK,
        ),
        eos="[EOS]",
    ),
    "minimax_m2": TokenizerRecipe(
        "MiniMax-M2.jinja",
        specials=("]~b]", "]~!b[", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>", *_THINK),
        eos="[e~[",
    ),
    "gpt_oss": TokenizerRecipe(
        "openai-gpt-oss-120b.jinja",
        specials=(
            "<|start|>",
            "<|channel|>",
            "<|message|>",
            "<|constrain|>",
            "<|end|>",
            "<|call|>",
            "<|return|>",
        ),
        eos="<|return|>",
    ),
    "deepseek_v32": TokenizerRecipe(
        # As published: no chat template (the family and the reference render with the
        # official encoder), recognised by its checkpoint's model_type.
        None,
        specials=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", *_THINK),
        eos="<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>",
        model_type="deepseek_v32",
    ),
}


def family_tokenizer(name: str) -> Any:
    """The test tokenizer of family ``name``, or a skip that says what is missing."""
    from transformers import AutoTokenizer

    recipe = RECIPES.get(name)
    if recipe is None:
        pytest.skip(f"no test tokenizer recipe for family {name!r} in {Path(__file__).name}")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    if recipe.template is not None:
        tokenizer.chat_template = upstream_template(recipe.template)
        tokenizer.unk_token = None  # SmolLM2's unk is <|endoftext|>, a turn end elsewhere
    if recipe.specials:
        tokenizer.add_special_tokens({"additional_special_tokens": list(recipe.specials)})
    if recipe.plain:
        tokenizer.add_tokens(list(recipe.plain))
    if recipe.eos:
        tokenizer.eos_token = recipe.eos
    if recipe.bos:
        tokenizer.bos_token = recipe.bos
    if recipe.model_type:
        checkpoint = Path(tempfile.mkdtemp(prefix=f"polar-{name}-"))
        tokenizer.chat_template = None
        tokenizer.unk_token = None
        tokenizer.save_pretrained(str(checkpoint))
        (checkpoint / "chat_template.jinja").unlink(missing_ok=True)
        (checkpoint / "config.json").write_text(json.dumps({"model_type": recipe.model_type}))
        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    return tokenizer


def upstream_template(file: str) -> str:
    """A family's published template (``miles:<file>``: from miles-tito-tokenizers)."""
    if file.startswith("miles:"):
        return miles_path(f"templates/{file.removeprefix('miles:')}").read_text("utf-8")
    return llama_cpp_template(file)


def vllm_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's chat preprocessing of request messages, before its chat template runs."""
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if content is None:
            message["content"] = ""
        elif isinstance(content, list):
            texts = [p.get("text", "") for p in content if p.get("type") == "text"]
            message["content"] = "\n".join(texts)
        reasoning = message.pop("reasoning", None) or message.pop("reasoning_content", None)
        if message.get("role") == "assistant" and reasoning is not None:
            message["reasoning"] = message["reasoning_content"] = reasoning
        calls = message.get("tool_calls")
        if isinstance(calls, list) and not calls:
            message.pop("tool_calls")
        elif calls:
            message["tool_calls"] = [_dict_arguments(call) for call in calls]
        out.append(message)
    return out


def _dict_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        function["arguments"] = json.loads(arguments) if arguments else {}
    return {**call, "function": function}


# ---- samplers: (content, calls, reasoning) -> the text the model emits, and its turn end ----

Calls = list[tuple[str, dict[str, Any]]]


def _reversed_json(value: dict[str, Any]) -> str:
    """Keys in reverse order, pretty-printed: valid, and never what a template re-renders."""
    return json.dumps(dict(reversed(list(value.items()))), ensure_ascii=False, indent=4)


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _hermes(content: str, calls: Calls) -> str:
    blocks = [
        "<tool_call>\n" + _reversed_json({"name": n, "arguments": a}) + "\n</tool_call>"
        for n, a in calls
    ]
    return "\n".join([content, *blocks] if content else blocks)


def _qwen3_coder(content: str, calls: Calls) -> str:
    blocks = []
    for name, arguments in calls:
        params = "".join(
            f"<parameter={key}>\n{_value_text(value)}\n</parameter>\n"
            for key, value in reversed(list(arguments.items()))
        )
        blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
    return "\n".join([content, *blocks] if content else blocks)


def _llama3(content: str, calls: Calls) -> str:
    if not calls:
        return content
    ((name, arguments),) = calls
    return "<|python_tag|>" + _reversed_json({"name": name, "parameters": arguments})


def _glm47(content: str, calls: Calls) -> str:
    blocks = [
        f"<tool_call>{name}"
        + "".join(
            f"<arg_key>{key}</arg_key><arg_value>{_value_text(value)}</arg_value>"
            for key, value in reversed(list(arguments.items()))
        )
        + "</tool_call>"
        for name, arguments in calls
    ]
    return content + "".join(blocks)


def _kimi(content: str, calls: Calls) -> str:
    if not calls:
        return content
    blocks = "".join(
        f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>"
        + _reversed_json(arguments)
        + "<|tool_call_end|>"
        for index, (name, arguments) in enumerate(calls)
    )
    return f"{content}<|tool_calls_section_begin|>{blocks}<|tool_calls_section_end|>"


def _minimax(content: str, calls: Calls) -> str:
    if not calls:
        return content
    invokes = "".join(
        f'<invoke name="{name}">\n'
        + "".join(
            f'<parameter name="{key}">{_value_text(value)}</parameter>\n'
            for key, value in reversed(list(arguments.items()))
        )
        + "</invoke>\n"
        for name, arguments in calls
    )
    return f"{content}\n<minimax:tool_call>\n{invokes}</minimax:tool_call>"


def _dsml(content: str, calls: Calls) -> str:
    if not calls:
        return content
    bar = "\uff5cDSML\uff5c"
    invokes = "".join(
        f'<{bar}invoke name="{name}">\n'
        + "".join(
            f'<{bar}parameter name="{key}" string="{str(isinstance(value, str)).lower()}">'
            f"{_value_text(value)}</{bar}parameter>\n"
            for key, value in reversed(list(arguments.items()))
        )
        + f"</{bar}invoke>\n"
        for name, arguments in calls
    )
    return f"{content}\n\n<{bar}function_calls>\n{invokes}</{bar}function_calls>"


def _harmony(content: str, calls: Calls) -> str:
    if not calls:
        return f"<|channel|>final<|message|>{content}"
    ((name, arguments),) = calls
    return (
        f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
        + _reversed_json(arguments)
    )


@dataclass(frozen=True)
class Sampler:
    """A call format: the text of a turn, and the token the model ends it with."""

    text: Callable[[str, Calls], str]
    think: Callable[[str], str] = lambda reasoning: f"<think>\n{reasoning}\n</think>\n\n"
    call_end: str | None = None  # the turn end after a call (default: the family's first)
    answer_end: str | None = None


SAMPLERS: dict[str, Sampler] = {
    "hermes": Sampler(_hermes),
    "qwen3": Sampler(_hermes),
    "qwen3_coder": Sampler(_qwen3_coder),
    "llama3_json": Sampler(_llama3, call_end="<|eom_id|>", answer_end="<|eot_id|>"),
    "glm47": Sampler(
        _glm47,
        think=lambda reasoning: f"<think>{reasoning}</think>",
        call_end="<|observation|>",
        answer_end="<|user|>",
    ),
    "kimi_k2": Sampler(_kimi, think=lambda reasoning: f"<think>{reasoning}</think>"),
    "minimax_m2": Sampler(_minimax),
    "deepseek_v32": Sampler(_dsml, think=lambda reasoning: f"{reasoning}</think>"),
    "openai": Sampler(
        _harmony,
        think=lambda r: f"<|channel|>analysis<|message|>{r}<|end|><|start|>assistant",
        call_end="<|call|>",
        answer_end="<|return|>",
    ),
}


def sampler_for(family: Family) -> Sampler:
    sampler = SAMPLERS.get(family.tool_parser)
    if sampler is None:
        pytest.skip(
            f"no sampler for {family.name}'s call format {family.tool_parser!r} in "
            f"{Path(__file__).name}"
        )
    return sampler


class FamilyBackend(ScriptedBackend):
    """The scripted engine as a model of ``family``: it samples the family's format
    non-canonically, ends turns with the family's own tokens, and renders chat (``/tokenize``,
    chat completions) exactly as vLLM would with the family's template."""

    def __init__(self, family: Family, tokenizer: Any, **options: Any) -> None:
        super().__init__(tokenizer=tokenizer, noncanonical=True, **options)
        self.family = family
        self.sampler = sampler_for(family)
        ends = family.turn_end_tokens(tokenizer)
        self.call_end = self.sampler.call_end or ends[0]
        self.answer_end = self.sampler.answer_end or ends[0]
        # Templates that open the reasoning block in the generation prompt (Qwen3-Next,
        # Thinking-2507): the model samples from inside it.
        probe = self.render_text([{"role": "user", "content": "hi"}], None).rstrip()
        self.opens_think = probe.endswith("<think>")
        # A prompt that closes the reasoning block (thinking off) leaves none to sample.
        self.thinks = family.features.reasoning and not probe.endswith("</think>")

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        return str(
            self.family.render(
                self.tokenizer,
                vllm_messages(messages),
                tools or None,
                chat_template=self.family.chat_template(self.tokenizer),
                variables=variables,
            )
            if type(self.family).render is not Family.render
            else self.tokenizer.apply_chat_template(
                vllm_messages(messages),
                chat_template=self.family.chat_template(self.tokenizer),
                add_generation_prompt=True,
                tokenize=False,
                **self.tokenizer_code_inputs(tools),
                **(variables or {}),
            )
        )

    def tokenizer_code_inputs(self, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The template's tool inputs as the family's own tokenizer code gives them: Kimi's
        key-sorts the tools and passes their TypeScript declarations (Moonshot's encoder, the
        independent reference) as ``tools_ts_str`` where the template reads them."""
        template = self.family.chat_template(self.tokenizer) or ""
        if not tools or "tools_ts_str" not in template:
            return {"tools": tools or None}
        tools = deep_sorted(tools)
        with suppress(ValueError, TypeError, KeyError, AttributeError):
            return {"tools": tools, "tools_ts_str": kimi_reference_encoder()(tools)}
        return {"tools": tools}

    def prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
        variables: dict[str, Any] | None = None,
    ) -> list[int]:
        text = self.render_text(messages, tools, variables)
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def sample(
        self, reply: ScriptedReply, max_tokens: int, stops: list[str] | None = None
    ) -> tuple[list[int], str, list[Any], str | None]:
        text = self.sampler.text(reply.content, reply.tool_calls)
        if reply.reasoning and self.thinks:
            think = self.sampler.think(reply.reasoning)
            if self.opens_think:
                think = think.removeprefix("<think>").lstrip("\n")
            text = think + text
        end = self.call_end if reply.tool_calls else self.answer_end
        ids = split_tokenization(self.tokenizer, text)
        finish = "tool_calls" if reply.tool_calls else "stop"
        if len(ids) >= max_tokens:
            return ids[:max_tokens], "length", [], None
        return [*ids, int(self.tokenizer.convert_tokens_to_ids(end))], finish, [], None


def split_tokenization(tokenizer: Any, text: str) -> list[int]:
    """``text``'s ids with its longest ordinary token split in two: the same text, ids that
    re-encoding does not give back (as sampled ids often are)."""
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    pieces = [(len(tokenizer.decode([t])), i) for i, t in enumerate(ids) if t not in special]
    if not pieces:
        return ids
    width, at = max(pieces)
    piece = tokenizer.decode([ids[at]])
    if width < 2:
        return ids
    split = [
        int(t)
        for part in (piece[:1], piece[1:])
        for t in tokenizer.encode(part, add_special_tokens=False)
    ]
    out = ids[:at] + split + ids[at + 1 :]
    assert tokenizer.decode(out) == tokenizer.decode(ids)
    return out


class ServedGateway:
    """A live gateway (gateway-side rendering) in front of a :class:`FamilyBackend`, shaped
    like the harness tests' ``live_gateway`` (``run_cli`` drives it)."""

    def __init__(self, backend: ScriptedBackend, db: Path) -> None:
        self.backend = backend
        self.store = CaptureStore(db)
        config = GatewayConfig(capture_db=db, render={"mode": "gateway"})
        self.app = create_app(config, engine=ScriptedEngine(backend), store=self.store)
        self.server = BackgroundServer(self.app, loop="asyncio")
        self.config = config

    def __enter__(self) -> ServedGateway:
        self.server.__enter__()
        self.base_url = self.server.url
        self.config.public_url = self.base_url
        self.admin = {"x-polar-admin-token": app_services(self.app).admin_token or ""}
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    def new_session(self) -> SessionHandle:
        reply = httpx.post(f"{self.base_url}/polar/sessions", json={}, headers=self.admin)
        reply.raise_for_status()
        return SessionHandle(reply.json()["api_key"])

    def script(self, *replies: ScriptedReply) -> None:
        self.backend.script.push(*replies)

    def records(self, key: str) -> list[CaptureRecord]:
        return self.store.records(key)

    async def family(self) -> str | None:
        facts = await app_services(self.app).proxy.facts()
        family = getattr(facts.renderer, "family", None)
        return getattr(family, "name", None)


@dataclass(frozen=True)
class SessionHandle:
    key: str
