"""SmolLM2 is recognised by its own added tokens under a ChatML template, never by vocabulary
size nor by a name in the template (SmolLM3's names SmolLM too)."""

from __future__ import annotations

from typing import Any

import pytest

from artifacts import llama_cpp_template, qwen_tokenizer  # tests/artifacts.py
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
    from polar.rendering.model_files import load_tokenizer

    return load_tokenizer()


def test_another_vocabulary_of_the_same_size_is_not_taken_for_smollm2() -> None:
    tok = _other_49152_vocabulary()
    assert len(tok) == 49152
    assert detect_family(tok) is None


def test_smollm2_is_recognised_by_its_own_tokenizer(smollm2: Any) -> None:
    family = detect_family(smollm2)
    assert family is not None and family.name == "smollm2"


def test_a_template_naming_smollm_over_another_vocabulary_is_not_smollm2() -> None:
    """SmolLM3's published template (ChatML, its own tool format, "SmolLM3" in its text) over
    a real vocabulary with ChatML tokens that is not SmolLM2's: Polar's bundled SmolLM2
    template must not replace it."""
    template = llama_cpp_template("HuggingFaceTB-SmolLM3-3B.jinja")
    assert "SmolLM" in template and "<|im_start|>" in template
    family = detect_family(qwen_tokenizer(template))
    assert family is None or family.name != "smollm2"


def test_smollm2_under_a_plain_chatml_template_is_recognised_by_its_own_tokens(
    smollm2: Any,
) -> None:
    from transformers import AutoTokenizer

    from polar.rendering.model_files import tokenizer_cache_path

    tok = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    tok.chat_template = CHATML
    family = detect_family(tok)
    assert family is not None and family.name == "smollm2"
