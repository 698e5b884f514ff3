"""The ``<think>...</think>`` block Qwen3-family models open a turn with.

Newlines are stripped the way the Qwen3 chat template strips them when it renders the turn back
(``reasoning.strip('\\n')``, ``content.lstrip('\\n')``), so a re-rendered turn matches what was
sampled whenever the model followed the template's own layout.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def split_think(text: str) -> tuple[str | None, str]:
    """(reasoning, rest); reasoning is None when the turn has no think block.

    A bare ``...</think>`` counts too: the generation prompt may already have opened ``<think>``.
    A ``<think>`` never closed (the turn ran out of tokens while thinking) is all reasoning.
    """
    if THINK_CLOSE in text:
        head, _, rest = text.partition(THINK_CLOSE)
        stripped = head.lstrip()
        if stripped.startswith(THINK_OPEN):
            head = stripped[len(THINK_OPEN) :]
        return head.strip("\n"), rest.lstrip("\n")
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN) :].strip("\n"), ""
    return None, text
