"""Real third-party artifacts for rendering tests, fetched from PyPI, never copied into the repo.

* the upstream chat templates llama.cpp vendors, from the ``llama-cpp-python==0.3.36`` sdist;
* ``miles-tito-tokenizers==0.1.1`` (the ``test`` extra): append-only templates, DeepSeek
  encoders, mock trajectories;
* Kimi K2.5's own TypeScript tool-declaration encoder (the copy in the ``tinker-cookbook``
  wheel), the reference for Polar's;
* Qwen's real vocabulary (``qwen.tiktoken`` in the ``qwen-agent==0.0.34`` wheel) as a fast
  tokenizer, with a family's special tokens at their real ids.

Downloads are cached under ``$POLAR_TEST_ARTIFACTS`` (default ``~/.cache/polar-test-artifacts``);
a test that cannot get an artifact is skipped with the reason.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

LLAMA_CPP = "llama-cpp-python==0.3.36"
QWEN_AGENT = "qwen-agent==0.0.34"
TINKER_COOKBOOK = "tinker-cookbook==0.6.1"
# Moonshot's Kimi K2.5 tool-declaration encoder, as tinker-cookbook ships it (stdlib only).
_KIMI_TS = "tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py"
_TEMPLATES = "vendor/llama.cpp/models/templates/"
# Qwen2's pre-tokenizer (digits one at a time), as in the models' tokenizer.json.
_QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2.5/Qwen3 added tokens from id 151643 on: (text, special).
_QWEN_ADDED = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN_FIRST_ADDED_ID = 151643


def cache_dir() -> Path:
    root = os.environ.get("POLAR_TEST_ARTIFACTS")
    path = Path(root) if root else Path.home() / ".cache" / "polar-test-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _download(requirement: str, *, sdist: bool) -> Path:
    """The downloaded file of ``requirement`` in the cache (pip download), or a skip."""
    folder = cache_dir() / "dl"
    stem = requirement.split("==")[0].replace("-", "_")
    found = sorted(folder.glob(f"{stem}-*")) if folder.is_dir() else []
    if found:
        return found[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(folder)]
    command += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    try:
        subprocess.run([*command, requirement], check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot download {requirement} from PyPI: {exc}")
    found = sorted(folder.glob(f"{stem}-*"))
    if not found:
        pytest.skip(f"pip download of {requirement} left no file in {folder}")
    return found[0]


@cache
def _llama_cpp_templates() -> Path:
    target = cache_dir() / "llama-cpp-python-0.3.36-templates"
    if target.is_dir():
        return target
    archive = _download(LLAMA_CPP, sdist=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}")
    partial.mkdir(exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            source = tar.extractfile(member) if inner.startswith(_TEMPLATES) else None
            if source is not None:
                (partial / Path(inner).name).write_bytes(source.read())
    try:
        os.replace(partial, target)
    except OSError:  # another test process got there first
        shutil.rmtree(partial, ignore_errors=True)
    return target


def llama_cpp_template(name: str) -> str:
    """An upstream chat template llama.cpp vendors, e.g. ``Qwen3.5-4B.jinja``."""
    path = _llama_cpp_templates() / name
    if not path.is_file():
        pytest.skip(f"{LLAMA_CPP} ships no template {name}")
    return path.read_text("utf-8")


def miles_path(relative: str = "") -> Path:
    """A file or folder of the installed ``miles-tito-tokenizers`` package (the test extra)."""
    try:
        import miles_tito_tokenizers
    except ImportError:
        pytest.skip("miles-tito-tokenizers is not installed (pip install -e '.[test]')")
    path = Path(miles_tito_tokenizers.__file__).parent / relative
    if not path.exists():
        pytest.skip(f"miles-tito-tokenizers has no {relative}")
    return path


@cache
def kimi_reference_encoder() -> Any:
    """Moonshot's ``encode_tools_to_typescript_style`` (the module from the tinker-cookbook
    wheel, loaded alone without installing the package)."""
    import importlib.util

    target = cache_dir() / "kimi_tool_declaration_ts.py"
    if not target.is_file():
        with zipfile.ZipFile(_download(TINKER_COOKBOOK, sdist=False)) as archive:
            data = archive.read(_KIMI_TS)
        partial = target.with_suffix(f".{os.getpid()}")
        partial.write_bytes(data)
        os.replace(partial, target)
    spec = importlib.util.spec_from_file_location("kimi_tool_declaration_ts", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.encode_tools_to_typescript_style


@cache
def qwen_tiktoken_path() -> Path:
    """``qwen.tiktoken`` (151,643 BPE ranks) from the qwen-agent wheel, in the cache."""
    target = cache_dir() / "qwen.tiktoken"
    if target.is_file():
        return target
    wheel = _download(QWEN_AGENT, sdist=False)
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read("qwen_agent/utils/qwen.tiktoken")
    partial = target.with_suffix(f".{os.getpid()}")
    partial.write_bytes(data)
    os.replace(partial, target)
    return target


@cache
def _qwen_base_json() -> Path:
    """Qwen's vocabulary as a tokenizer.json (converted once, ~a minute), in the cache."""
    target = cache_dir() / "qwen-tokenizer.json"
    if target.is_file():
        return target
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            # The tiktoken format (base64 token, rank per line), without the tiktoken package.
            ranks = {}
            for line in Path(tiktoken_url).read_bytes().splitlines():
                if line:
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
            return ranks

    tokenizer = _Converter(vocab_file=str(qwen_tiktoken_path()), pattern=_QWEN_PATTERN).converted()
    partial = target.with_suffix(f".{os.getpid()}")
    tokenizer.save(str(partial))
    os.replace(partial, target)
    return target


def qwen_tokenizer(
    chat_template: str | None = None,
    extra: list[tuple[str, bool]] | None = None,
    *,
    eos: str = "<|im_end|>",
) -> Any:
    """A fast tokenizer on Qwen's real vocabulary, its added tokens at their real ids
    (151643...), then ``extra`` (text, special) tokens after them for other families."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(_qwen_base_json()))
    assert len(tokenizer) == QWEN_FIRST_ADDED_ID
    for text, special in [*_QWEN_ADDED, *(extra or [])]:
        token = AddedToken(text, special=special, normalized=False)
        tokenizer.add_tokens([token], special_tokens=special)
    tokenizer.eos_token = eos
    tokenizer.pad_token = "<|endoftext|>"
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer
