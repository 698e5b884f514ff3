"""Opt-in template-glue repair: see the prefix relation through known chat-template quirks.

Some chat templates render a turn differently in the generation prompt than in history, or
re-render older history once the conversation moves on. The engine's prompts then stop being
token prefixes of each other and a strict merge fragments one agent into several traces. Each
rule below names one such quirk; when enabled, tokens the quirk touches are set aside for the
prefix comparison only. The merged trace still holds every prompt token of the chain's first
call and every sampled id unchanged; how many tokens a step set aside is reported as
``repaired_tokens``, so a repaired merge is never mistaken for an exact one.

Rules (the names used in ``BuilderConfig.template_repair``):

* ``qwen3_empty_think`` (Qwen3 with thinking off): the generation prompt ends with an empty
  ``<think>\\n\\n</think>\\n\\n`` block that the same turn does not carry in history.
* ``drop_past_reasoning`` (Qwen3, QwQ, DeepSeek-R1 style): reasoning blocks of earlier turns are
  dropped from history (Qwen3 drops them once a new user query arrives, so even turns that were
  already re-rendered with their reasoning change).
* ``smollm2_default_system`` (SmolLM2): the template invents ``You are a helpful AI assistant
  named SmolLM...`` whenever the first message is not a system message, so a call without a
  system message and a call with one differ in their first block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polar.errors import ConfigError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"


@dataclass(frozen=True)
class RepairTokens:
    """The token ids the rules look for, read once from the model's tokenizer."""

    think_open: int | None = None
    think_close: int | None = None
    newline_ids: tuple[int, ...] = ()
    turn_start: int | None = None
    turn_end: int | None = None
    system_header: tuple[int, ...] = ()
    default_system: tuple[int, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> RepairTokens:
        """Ids from a HF tokenizer; the default system block is read off its chat template."""

        def single(text: str) -> int | None:
            ids = tokenizer.encode(text, add_special_tokens=False)
            return int(ids[0]) if len(ids) == 1 else None

        newlines = {single("\n" * k) for k in range(1, 9)} - {None}
        return cls(
            think_open=single(THINK_OPEN),
            think_close=single(THINK_CLOSE),
            newline_ids=tuple(sorted(i for i in newlines if i is not None)),
            turn_start=single(TURN_START),
            turn_end=single(TURN_END),
            system_header=tuple(tokenizer.encode("system\n", add_special_tokens=False)),
            default_system=_default_system_block(tokenizer),
        )


def _default_system_block(tokenizer: Any) -> tuple[int, ...]:
    """The system block a template renders for a conversation that has none (or nothing)."""
    if not getattr(tokenizer, "chat_template", None):
        return ()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    head, found, _ = str(text).partition(TURN_START + "user")
    if not found or not head.startswith(TURN_START + "system"):
        return ()
    return tuple(tokenizer.encode(head, add_special_tokens=False))


def qwen3_empty_think(ids: np.ndarray, tokens: RepairTokens) -> np.ndarray:
    """Set aside ``<think>`` blocks with only newlines inside, and the newlines after them."""
    starts, closes, ends = _think_spans(ids, tokens)
    words = np.cumsum(~np.isin(ids, tokens.newline_ids))
    closed = closes >= 0
    inner = words[np.maximum(closes - 1, 0)] - words[starts]
    empty = closed & (inner == 0)
    return _span_mask(len(ids), starts[empty], ends[empty])


def drop_past_reasoning(ids: np.ndarray, tokens: RepairTokens) -> np.ndarray:
    """Set aside every ``<think>...</think>`` block and the newlines the template puts after it.

    An unclosed block (a generation prompt that opens ``<think>``) runs to the end.
    """
    starts, _, ends = _think_spans(ids, tokens)
    return _span_mask(len(ids), starts, ends)


def smollm2_default_system(ids: np.ndarray, tokens: RepairTokens) -> tuple[int, bool]:
    """The length of the leading system block (0 if none) and whether it is the invented one."""
    header = (tokens.turn_start, *tokens.system_header)
    if len(ids) < len(header) or tuple(int(t) for t in ids[: len(header)]) != header:
        return 0, False
    ends = np.flatnonzero(ids == tokens.turn_end)
    if not len(ends):
        return 0, False
    length = int(ends[0]) + 1
    if length < len(ids) and int(ids[length]) in tokens.newline_ids:
        length += 1
    default = tokens.default_system
    return length, length == len(default) and tuple(int(t) for t in ids[:length]) == default


MaskRule = Callable[[np.ndarray, RepairTokens], np.ndarray]
MASK_RULES: dict[str, MaskRule] = {
    "qwen3_empty_think": qwen3_empty_think,
    "drop_past_reasoning": drop_past_reasoning,
}
HEAD_RULES = {"smollm2_default_system": smollm2_default_system}
RULES = (*MASK_RULES, *HEAD_RULES)
_NEEDS: dict[str, tuple[str, ...]] = {
    "qwen3_empty_think": ("think_open", "think_close", "newline_ids"),
    "drop_past_reasoning": ("think_open", "think_close", "newline_ids"),
    "smollm2_default_system": ("turn_start", "turn_end", "system_header", "default_system"),
}


@dataclass
class PromptView:
    """A prompt as the rules see it: ids, the positions kept for comparison, its head block."""

    ids: np.ndarray
    kept: np.ndarray
    head_len: int = 0
    head_default: bool = False


@dataclass(frozen=True)
class RepairedMatch:
    """``p`` extends into ``q`` from ``q_start``; ``canonical_len`` ranks longest matches."""

    q_start: int
    canonical_len: int
    repaired_tokens: int


class TemplateRepair:
    """The enabled rules, compiled against one tokenizer's ids."""

    def __init__(self, rules: Sequence[str], tokens: RepairTokens) -> None:
        unknown = [r for r in rules if r not in RULES]
        if unknown:
            raise ConfigError(
                f"unknown template_repair rule(s) {unknown} (known: {', '.join(RULES)})"
            )
        for rule in rules:
            missing = [name for name in _NEEDS[rule] if not getattr(tokens, name)]
            if missing:
                raise ConfigError(
                    f"template_repair rule {rule!r} needs {', '.join(missing)} as token ids, "
                    "which this tokenizer does not provide; set builder config 'tokenizer' to "
                    "the model's tokenizer"
                )
        self.rules = list(rules)
        self.tokens = tokens
        self._masks = [MASK_RULES[r] for r in rules if r in MASK_RULES]
        self._heads = any(r in HEAD_RULES for r in rules)

    def view(self, ids: np.ndarray) -> PromptView:
        """Apply the rules to one prompt (vectorized; once per call)."""
        aside = np.zeros(len(ids), dtype=bool)
        for rule in self._masks:
            aside |= rule(ids, self.tokens)
        head_len, head_default = (
            smollm2_default_system(ids, self.tokens) if self._heads else (0, False)
        )
        return PromptView(ids, np.flatnonzero(~aside), head_len, head_default)

    def match(self, p: PromptView, q: PromptView) -> RepairedMatch | None:
        """Whether ``q`` extends ``p`` once the rules' tokens are set aside, and from where.

        The new part of ``q`` starts right after the last token it shares with ``p``, so a block
        ``q`` re-renders (a past turn's reasoning, kept in a tool loop) stays in its new part.
        """
        p_off = q_off = 0
        if p.head_len and q.head_len and p.head_default != q.head_default:
            p_off, q_off = p.head_len, q.head_len
        p_kept = p.kept[p.kept >= p_off]
        q_kept = q.kept[q.kept >= q_off]
        n = len(p_kept)
        if n >= len(q_kept) or n == 0:
            return None
        if p.ids[p_kept[-1]] != q.ids[q_kept[n - 1]]:
            return None
        if not np.array_equal(p.ids[p_kept], q.ids[q_kept[:n]]):
            return None
        q_start = int(q_kept[n - 1]) + 1
        aside = (len(p.ids) - n) + (q_start - n)
        return RepairedMatch(q_start=q_start, canonical_len=n, repaired_tokens=aside)


def _think_spans(
    ids: np.ndarray, tokens: RepairTokens
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each think block's start, closing tag (-1 if unclosed) and end past trailing newlines."""
    starts = np.flatnonzero(ids == tokens.think_open)
    closes = np.full(len(starts), -1)
    ends = np.full(len(starts), len(ids))
    tags = np.flatnonzero(ids == tokens.think_close)
    if len(starts) and len(tags):
        at = np.searchsorted(tags, starts)
        closed = at < len(tags)
        closes[closed] = tags[at[closed]]
        words = np.flatnonzero(~np.isin(ids, tokens.newline_ids))
        nxt = np.searchsorted(words, closes[closed] + 1)
        ends[closed] = np.where(nxt < len(words), words[np.minimum(nxt, len(words) - 1)], len(ids))
    return starts, closes, ends


def _span_mask(n: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A boolean mask covering ``[start, end)`` spans (overlaps allowed)."""
    delta = np.zeros(n + 1, dtype=np.int32)
    np.add.at(delta, starts, 1)
    np.add.at(delta, ends, -1)
    return np.cumsum(delta[:n]) > 0
