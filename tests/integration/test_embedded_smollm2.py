"""The embedded engine with the real SmolLM2-135M-Instruct (slow: loads a 135M model on CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from polar.engines.embedded import (
    EmbeddedEngineCore,
    GenerationParams,
    create_app,
    load_model,
    loader,
)
from polar.engines.embedded.loader import converted_checkpoint_dir
from polar.rendering.model_files import smollm2_gguf_path

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def core() -> Iterator[EmbeddedEngineCore]:
    engine = EmbeddedEngineCore(load_model("smollm2"))
    yield engine
    engine.close()


def teacher_forced(core: EmbeddedEngineCore, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + sampled])
    with torch.inference_mode():
        logits = core.module(input_ids=ids).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return steps.gather(-1, torch.tensor(sampled)[:, None]).squeeze(-1)


def no_conversion(*args: object) -> None:
    raise AssertionError("a cached checkpoint was converted from the GGUF again")


def test_cached_checkpoint_is_plain_and_reloads_without_converting(
    core: EmbeddedEngineCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reload reads the cached checkpoint, never the GGUF (a 1 s bound flaked on loaded cores)."""
    checkpoint = converted_checkpoint_dir(smollm2_gguf_path())
    assert (checkpoint / "model.safetensors").is_file()
    assert getattr(core.module.config, "quantization_config", None) is None
    assert core.module.config.num_hidden_layers == 30 and core.max_model_len == 8192
    monkeypatch.setattr(loader, "_convert_gguf", no_conversion)
    again = load_model("smollm2")
    for p, q in zip(core.module.parameters(), again.module.parameters(), strict=True):
        assert torch.equal(p, q)


def test_first_load_converts_the_gguf_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path))
    converted = load_model("smollm2")
    checkpoint = converted_checkpoint_dir(smollm2_gguf_path())
    assert checkpoint.is_relative_to(tmp_path) and (checkpoint / "config.json").is_file()
    assert not list(checkpoint.parent.glob(".convert-*"))  # no staging left behind
    monkeypatch.setattr(loader, "_convert_gguf", no_conversion)
    cached = load_model("smollm2")
    ids = torch.tensor([[1, 4093, 198, 19556, 2]])
    with torch.inference_mode():
        torch.testing.assert_close(
            converted.module(input_ids=ids).logits, cached.module(input_ids=ids).logits
        )


def test_greedy_answer_is_faithful(core: EmbeddedEngineCore) -> None:
    result = core.generate_sync(QUESTION, params=GenerationParams(max_tokens=48, temperature=0))
    choice = result.choices[0]
    assert "Paris" in choice.content and choice.finish_reason == "stop"
    assert choice.token_ids[-1] == 2  # <|im_end|> ends a naturally stopped turn
    rendered = core.tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=False
    )
    assert result.prompt_ids == core.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    expected = teacher_forced(core, result.prompt_ids, choice.token_ids)
    assert torch.max(torch.abs(torch.tensor(choice.logprobs) - expected)) < 1e-4


def test_sampled_multi_turn_logprobs_match_teacher_forcing(core: EmbeddedEngineCore) -> None:
    params = GenerationParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=7)
    first = core.generate_sync(QUESTION, params=params)
    turn = [
        *QUESTION,
        {"role": "assistant", "content": first.choices[0].text},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = core.generate_sync(turn, params=params)
    assert second.timing["reused_prefix_tokens"] > len(first.prompt_ids)
    for result in (first, second):
        choice = result.choices[0]
        expected = teacher_forced(core, result.prompt_ids, choice.token_ids)
        assert torch.max(torch.abs(torch.tensor(choice.logprobs) - expected)) < 1e-4


async def test_http_reply_carries_the_same_tokens(core: EmbeddedEngineCore) -> None:
    app = create_app(core)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as c:
        reply = (
            await c.post(
                "/v1/chat/completions",
                json={
                    "model": core.model_name,
                    "messages": QUESTION,
                    "max_tokens": 48,
                    "temperature": 0,
                    "logprobs": True,
                    "top_logprobs": 0,
                    "return_token_ids": True,
                },
            )
        ).json()
    direct = core.generate_sync(QUESTION, params=GenerationParams(max_tokens=48, temperature=0))
    assert reply["prompt_token_ids"] == direct.prompt_ids
    assert reply["choices"][0]["token_ids"] == direct.choices[0].token_ids
    assert reply["choices"][0]["message"]["content"] == direct.choices[0].content
