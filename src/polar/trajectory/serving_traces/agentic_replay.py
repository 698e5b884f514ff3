"""``agentic_replay``: every captured call as one request of a Mooncake-style trace, grouped into
sessions with AIPerf's multi-turn fields and Polar's sub-agent markers.

Mooncake's four fields (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``)
let a replayer synthesize prompts with the same prefix sharing; ``session_id`` and ``delay``
are AIPerf's multi-turn fields; ``turn``, ``agent``, ``parent_turn`` and ``request_id`` say where
the call sits in its session's agent tree. docs/capture.md lists every field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from polar.trajectory.base import side_call_kind
from polar.trajectory.serving_traces.base import CapturedSession, ServingTrace, ms

_ROOT = b"polar-agentic-replay"


class BlockHashes:
    """Chained block hashes numbered in order of first appearance, across a whole export.

    Block ``i`` of a prompt (``block_size`` tokens, the last one possibly shorter) hashes its
    tokens together with block ``i - 1``'s hash, so equal ids mean an equal prefix up to and
    including that block, as in Mooncake's traces; ids are small integers from 0."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.ids: dict[bytes, int] = {}

    def __call__(self, tokens: Sequence[int]) -> list[int]:
        ids = np.asarray(tokens, dtype="<i4")
        out = []
        digest = _ROOT
        for start in range(0, len(ids), self.block_size):
            block = ids[start : start + self.block_size].tobytes()
            digest = hashlib.blake2b(digest + block, digest_size=16).digest()
            out.append(self.ids.setdefault(digest, len(self.ids)))
        return out


class AgenticReplay(ServingTrace):
    name = "agentic_replay"

    def rows(self, sessions: Iterator[CapturedSession], origin: float) -> Iterator[dict[str, Any]]:
        hashes = BlockHashes(self.block_size)
        for session in sessions:
            turn_of = {r.completion_id: i for i, r in enumerate(session.records)}
            previous = None
            for turn, record in enumerate(session.records):
                link = session.tree.links.get(record.completion_id)
                side = side_call_kind(record)
                parent = link.parent if link is not None else None
                agent = link.role.value if link is not None else None
                gap = record.started_at - previous.finished_at if previous is not None else 0.0
                yield {
                    "timestamp": ms(record.started_at - origin),
                    "input_length": len(record.prompt_ids),
                    "output_length": len(record.sampled_ids),
                    "hash_ids": hashes(record.prompt_ids),
                    "session_id": session.session_id,
                    "turn": turn,
                    "delay": max(0, ms(gap)),
                    "agent": f"side_call:{side}" if side else agent,
                    "parent_turn": turn_of.get(parent) if parent is not None else None,
                    "request_id": record.completion_id,
                }
                previous = record
