"""Model loading for the embedded engine (tiny model and local checkpoints; SmolLM2 is slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from polar.engines.embedded.loader import load_model, resolve_dtype
from polar.errors import ConfigError


def test_tiny_model_is_seeded_and_uses_the_real_tokenizer() -> None:
    a, b = load_model("tiny"), load_model("tiny")
    assert a.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert a.module.config.vocab_size == len(a.tokenizer) == 49152
    assert a.module.config.num_hidden_layers == 2 and a.max_model_len == 8192
    for (name, p), q in zip(a.module.named_parameters(), b.module.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert not a.module.training
    assert all(p.requires_grad for p in a.module.parameters())  # trainable, not frozen


def test_tiny_model_does_not_disturb_the_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model("tiny")
    assert torch.equal(torch.rand(3), expected)


def test_a_local_checkpoint_directory_loads_with_its_own_name(tmp_path: Path) -> None:
    tiny = load_model("tiny")
    tiny.module.save_pretrained(tmp_path / "my-model")
    tiny.tokenizer.save_pretrained(tmp_path / "my-model")
    loaded = load_model(str(tmp_path / "my-model"), dtype="bfloat16")
    assert loaded.name == "my-model"
    assert next(loaded.module.parameters()).dtype == torch.bfloat16
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        expected = tiny.module(input_ids=ids).logits
        got = loaded.module.float()(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.05)
    assert loaded.tokenizer.chat_template == tiny.tokenizer.chat_template


@pytest.mark.parametrize("source", ["no-such-model", "/nonexistent/dir", "README.md"])
def test_unknown_sources_are_config_errors(source: str) -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        load_model(source)


def test_unknown_dtype_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="float16"):
        resolve_dtype("float16")
