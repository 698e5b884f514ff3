"""Real tokenizers for builder tests: SmolLM2's, and a Qwen3-style one built from it."""

from __future__ import annotations

from typing import Any

import pytest

from polar.rendering.model_files import load_tokenizer, tokenizer_cache_path

from .sessions import QWEN3_TEMPLATE


@pytest.fixture(scope="session")
def smollm2() -> Any:
    return load_tokenizer()


@pytest.fixture(scope="session")
def qwen3_like(smollm2: Any) -> Any:
    """SmolLM2's tokenizer with ``<think>``/``</think>`` as added special tokens (as Qwen3 has
    them) and a reconstruction of Qwen3's chat template (see qwen3_chat_template.jinja)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tok.chat_template = QWEN3_TEMPLATE
    return tok
