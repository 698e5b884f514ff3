"""The embedded engine's option values, importable without torch (the CLI lists them)."""

from __future__ import annotations

DEFAULT_MODEL = "smollm2"
TINY_MODEL = "tiny"
DTYPE_NAMES = ("float32", "bfloat16")
LOGPROBS_MODES = ("raw", "processed")
