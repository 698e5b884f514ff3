"""SmolLM2 is recognised by its template and its own added tokens, never by vocabulary size."""

from __future__ import annotations

from typing import Any

import pytest

from polar.rendering.families.registry import detect_family

# Plain ChatML: the markup many models share, naming no model.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _other_49152_vocabulary() -> Any:
    """A word-level tokenizer of exactly 49,152 tokens whose ChatML tokens sit at its end."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 49150)}}
    backend = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def smollm2() -> Any:
    from polar.engines.model_files import load_tokenizer

    return load_tokenizer()


def test_another_vocabulary_of_the_same_size_is_not_taken_for_smollm2() -> None:
    tok = _other_49152_vocabulary()
    assert len(tok) == 49152
    assert detect_family(tok) is None


def test_smollm2_is_recognised_by_its_template(smollm2: Any) -> None:
    family = detect_family(smollm2)
    assert family is not None and family.name == "smollm2"


def test_smollm2_under_a_plain_chatml_template_is_recognised_by_its_own_tokens(
    smollm2: Any,
) -> None:
    from transformers import AutoTokenizer

    from polar.engines.model_files import tokenizer_cache_path

    tok = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    tok.chat_template = CHATML
    family = detect_family(tok)
    assert family is not None and family.name == "smollm2"
