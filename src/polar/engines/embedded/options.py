"""The embedded engine's option values, importable without torch (the CLI lists them)."""

from __future__ import annotations

from pathlib import Path

from polar.schemas.model_files import SMOLLM2_MODEL_NAME

DEFAULT_MODEL = "smollm2"
TINY_MODEL = "tiny"
TINY_MODEL_NAME = "polar-tiny-llama"
DTYPE_NAMES = ("float32", "bfloat16")
LOGPROBS_MODES = ("raw", "processed")


def served_model_name(source: str) -> str:
    """The name the engine serves ``source`` under, known before the model loads."""
    if source == DEFAULT_MODEL:
        return SMOLLM2_MODEL_NAME
    if source == TINY_MODEL:
        return TINY_MODEL_NAME
    path = Path(source).expanduser()
    return path.stem if path.suffix == ".gguf" else path.name
