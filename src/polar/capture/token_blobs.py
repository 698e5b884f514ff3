"""Compact, exact binary forms of token ids and logprobs, and prefix-shared prompt storage.

Agent sessions resend a growing prompt every turn, so storing each prompt whole costs
O(turns^2). A prompt is stored as (base completion, shared prefix length, suffix ids) against
the earlier prompt of the same session it shares the longest prefix with.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

_IDS = np.dtype("<i4")
_LOGPROBS = np.dtype("<f8")  # float64: the exact value the engine sent in JSON


def ids_to_blob(ids: list[int] | np.ndarray) -> bytes:
    return np.asarray(ids, dtype=_IDS).tobytes()


def blob_to_ids(blob: bytes | None) -> np.ndarray:
    return np.frombuffer(blob or b"", dtype=_IDS)


def logprobs_to_blob(logprobs: list[float] | None) -> bytes | None:
    return None if logprobs is None else np.asarray(logprobs, dtype=_LOGPROBS).tobytes()


def blob_to_logprobs(blob: bytes | None) -> list[float] | None:
    return None if blob is None else np.frombuffer(blob, dtype=_LOGPROBS).tolist()


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


@dataclass
class PrefixRef:
    base_id: str | None
    prefix_len: int
    suffix: np.ndarray


class PrefixIndex:
    """Recent prompts per session (bounded), to find the best base for a new prompt."""

    def __init__(self, per_session: int = 4, max_sessions: int = 4096, min_shared: int = 16):
        self.per_session = per_session
        self.max_sessions = max_sessions
        self.min_shared = min_shared
        self._recent: OrderedDict[str, deque[tuple[str, np.ndarray]]] = OrderedDict()

    def encode(self, session_id: str, completion_id: str, prompt: list[int]) -> PrefixRef:
        """Pick the base sharing the longest prefix, then remember this prompt."""
        ids = np.asarray(prompt, dtype=_IDS)
        recent = self._recent.get(session_id)
        best = PrefixRef(None, 0, ids)
        for base_id, base in recent or ():
            shared = common_prefix_len(base, ids)
            if shared >= self.min_shared and shared > best.prefix_len:
                best = PrefixRef(base_id, shared, ids[shared:])
        if recent is None:
            recent = self._recent[session_id] = deque(maxlen=self.per_session)
            if len(self._recent) > self.max_sessions:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(session_id)
        recent.append((completion_id, ids))
        return best

    def forget(self, session_id: str) -> None:
        self._recent.pop(session_id, None)
