"""Gradient checkpointing for the trainer's updates and the warm start's SFT.

Each decoder layer keeps only its input for the backward pass and is recomputed there (about
a third more compute). Without it a micro-batch's activations were most of a run's memory:
~4 GB for 4 tool_use sessions in a GRPO update, ~2.5 GB for 2 SFT rows (SDPA's attention
with a padding mask keeps a [heads, L, L] matrix per layer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def checkpointed(module: Any, enabled: bool) -> Iterator[bool]:
    """Checkpointing on ``module`` meanwhile; yields whether it is on.

    Transformers applies it in training mode only, so the module is in training mode
    meanwhile: the same function as in eval when it has no dropout, and a model with dropout
    is left as it is (the trainer's forward must be the engine's). A key-value cache passed to
    a checkpointed forward is not honoured (transformers drops it; a recomputed layer would
    append to it twice), so a caller that shares a prompt prefix through a cache must not
    while this yields True.
    """
    usable = enabled and getattr(module, "supports_gradient_checkpointing", False)
    if not usable or _has_dropout(module):
        yield False
        return
    module.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    module.train()
    try:
        yield True
    finally:
        module.activation_checkpointing_disable()
        module.eval()


def _has_dropout(module: Any) -> bool:
    config = module.config.get_text_config()
    rates = [v for k, v in vars(config).items() if "dropout" in k and isinstance(v, float)]
    return any(r > 0 for r in rates) or any(
        isinstance(m, torch.nn.Dropout) and m.p > 0 for m in module.modules()
    )
