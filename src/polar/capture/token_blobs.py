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


def exact_ids(values: list[int] | np.ndarray, what: str) -> np.ndarray:
    """``values`` as stored ids, or ValueError if storing them would change any of them.

    Records hold validated ints, so the conversion itself is the check: numpy refuses ints
    outside int32; negative ids are refused here.
    """
    try:
        arr = np.asarray(values, dtype=_IDS)
    except OverflowError as exc:
        raise ValueError(f"{what} do not fit 32 bits: {exc}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{what} are not a flat list")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{what} hold {int(arr.min())}, a negative id")
    return arr


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
    """Recent committed prompts per session (bounded), to find the best base for a new prompt.

    The store asks for a base with :meth:`choose` and calls :meth:`remember` only once the
    prompt's row is in the database, so a base is always a stored row of the same session.
    """

    def __init__(self, per_session: int = 4, max_sessions: int = 4096, min_shared: int = 16):
        self.per_session = per_session
        self.max_sessions = max_sessions
        self.min_shared = min_shared
        self._recent: OrderedDict[str, deque[tuple[str, np.ndarray]]] = OrderedDict()

    def choose(self, session_id: str, ids: np.ndarray) -> PrefixRef:
        """The stored prompt of this session sharing the longest prefix with ``ids``."""
        best = PrefixRef(None, 0, ids)
        for base_id, base in self._recent.get(session_id) or ():
            shared = common_prefix_len(base, ids)
            if shared >= self.min_shared and shared > best.prefix_len:
                best = PrefixRef(base_id, shared, ids[shared:])
        return best

    def remember(self, session_id: str, completion_id: str, ids: np.ndarray) -> None:
        recent = self._recent.get(session_id)
        if recent is None:
            recent = self._recent[session_id] = deque(maxlen=self.per_session)
            if len(self._recent) > self.max_sessions:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(session_id)
        recent.append((completion_id, ids))

    def forget(self, session_id: str) -> None:
        self._recent.pop(session_id, None)

    def clear(self) -> None:
        """Drop everything (after a rolled-back transaction: no base may name a lost row)."""
        self._recent.clear()
