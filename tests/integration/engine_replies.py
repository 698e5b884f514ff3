"""Reading captured records' flags in tests (the engine replies themselves: polar.engines.scripted.logged_tokens)."""

from __future__ import annotations


def gap_flags(flags: list[str]) -> list[str]:
    """A record's flags minus those that only say how its prompt was rendered."""
    return [f for f in flags if f != "rendered_by_gateway" and not f.startswith("prompt_")]
