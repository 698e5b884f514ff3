"""MoE routing replay (R3): the experts each token was routed to when the engine sampled.

vLLM 0.32 (started with ``--enable-return-routed-experts``; no request flag) returns per choice
``routed_experts``: a base64 ``.npy`` array of shape ``(positions, layers, top_k)`` covering
every prompt token and every sampled token but the last (which was never forwarded). A trainer
replays these choices in its forward so the policy it updates routes as the sampler did.

Polar keeps the array as vLLM sends it, with its integer type narrowed to the smallest that
holds the expert ids (uint8 for up to 256 experts): layers x top-k bytes per token, inside the
record's compressed body.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence

import numpy as np

from polar.errors import MalformedEngineReply
from polar.schemas.flags import FLAG_ROUTED_EXPERTS_MISALIGNED


def decode(text: str) -> np.ndarray:
    """The ``(positions, layers, top_k)`` array of a base64 ``.npy`` string."""
    try:
        array = np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)
    except (binascii.Error, ValueError, OSError) as exc:
        raise MalformedEngineReply(f"routed_experts is not a base64 .npy array: {exc}") from exc
    if array.ndim != 3 or array.dtype.kind not in "iu" or (array.size and array.min() < 0):
        raise MalformedEngineReply(
            f"routed_experts must be (positions, layers, top_k) expert ids, got "
            f"{array.dtype} {array.shape}"
        )
    return array


def encode(array: np.ndarray) -> str:
    """``array`` as a base64 ``.npy`` string, in the narrowest unsigned type that holds it."""
    top = int(array.max()) if array.size else 0
    dtype = np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.uint32
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=dtype), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def read_choice(choice: object, n_prompt: int, n_sampled: int, flags: list[str]) -> str | None:
    """A reply choice's routed experts, narrowed, if the engine sent them; flagged (and not kept)
    when they do not cover exactly the prompt and all sampled tokens but the last."""
    text = choice.get("routed_experts") if isinstance(choice, dict) else None
    if text is None:
        return None
    if not isinstance(text, str):
        raise MalformedEngineReply("routed_experts is not a string")
    array = decode(text)
    if array.shape[0] != n_prompt + n_sampled - 1:
        flags.append(FLAG_ROUTED_EXPERTS_MISALIGNED)
        return None
    return encode(array)


def merge(calls: Sequence[tuple[str | None, int]], length: int) -> np.ndarray | None:
    """The routing of a merged trace of ``length`` tokens from its chain's calls, each given as
    (its routed experts, prompt + sampled tokens): each position from the earliest call that
    forwarded it, i.e. sampled tokens as routed when they were sampled, interstitial tokens as
    routed in the prefill of the call that first saw them. None if any call lacks them."""
    parts: list[np.ndarray] = []
    covered = 0
    for text, n_tokens in calls:
        if text is None:
            return None
        array = decode(text)
        end = n_tokens - 1
        if end > covered:
            parts.append(array[covered:end])
            covered = end
    if not parts or covered != length - 1:
        return None
    return np.concatenate(parts)
