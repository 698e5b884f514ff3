"""Stored rows back into records, checking on the way everything a row claims about itself.

A row stores its prompt as (base completion, shared prefix length, suffix ids). Decoding walks
that chain back to a whole prompt iteratively (a 2,000-turn session is a 2,000-long chain) and
checks each link: the base exists, belongs to the same session, came earlier, is long enough,
and the rebuilt prompt has the length the row recorded; token blobs are whole and agree with
their counts; the body decompresses and validates. A row that fails any of these raises
:class:`~polar.errors.CorruptRecord` naming it, so a reader reports that row, not a crash.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import zstandard
from pydantic import ValidationError

from polar.capture.records import CaptureRecord
from polar.capture.token_blobs import blob_to_ids, blob_to_logprobs
from polar.errors import CorruptRecord
from polar.schemas.harness_ids import HarnessIds

# Fields kept in the compressed ``body`` column rather than in columns of their own.
BODY_FIELDS = (
    "engine",
    "engine_completion_id",
    "request",
    "upstream_request",
    "response",
    "harness_call_ids",
    "sampling",
    "dropped_tools",
    "notes",
    "routed_experts",
)

# The body column is a zstd frame (level 1: a Claude-Code-sized call, 160 KB of JSON, compresses
# in about 0.3 ms to 24 KB, where zlib level 1 took 1.4 ms for 50 KB). Stores written before
# hold zlib streams; reading tells them apart by the frame's magic number.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

Fetch = Callable[[str], "sqlite3.Row | None"]


def decompress_body(blob: bytes) -> bytes:
    """The JSON of a stored body, zstd (current) or zlib (stores from before)."""
    if blob[:4] == _ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().decompress(blob)
    return zlib.decompress(blob)


class RowDecoder:
    """Decodes rows of one store; ``fetch`` reads a row by completion id (for prompt bases).

    Recently rebuilt prompts are cached (``cache_size`` of them), so reading a session in call
    order rebuilds each prompt from its base without going back to the database.
    """

    def __init__(self, fetch: Fetch, cache_size: int = 64):
        self._fetch = fetch
        self._cache: OrderedDict[str, tuple[np.ndarray, dict[str, Any]]] = OrderedDict()
        self._cache_size = cache_size

    def record(self, row: sqlite3.Row) -> CaptureRecord:
        cid = row["completion_id"]
        try:
            prompt = self.prompt(row)
            sampled = blob_to_ids(row["sampled"])
            logprobs = blob_to_logprobs(row["logprobs"])
            body = orjson.loads(decompress_body(row["body"]))
        except CorruptRecord:
            raise
        except (ValueError, TypeError, zstandard.ZstdError, zlib.error) as exc:
            raise CorruptRecord(cid, f"undecodable: {exc}") from exc
        if len(sampled) != row["n_sampled"]:
            raise CorruptRecord(cid, f"{len(sampled)} sampled ids, the row says {row['n_sampled']}")
        if logprobs is not None and len(logprobs) != len(sampled):
            raise CorruptRecord(cid, f"{len(logprobs)} logprobs for {len(sampled)} sampled ids")
        try:
            return CaptureRecord(
                completion_id=cid,
                session_id=row["session_id"],
                seq=row["seq"],
                provider=row["provider"],
                model=row["model"],
                policy_version=row["policy_version"],
                started_at=row["started_at"],
                finished_at=row["finished_at"],
                prompt_ids=prompt.tolist(),
                sampled_ids=sampled.tolist(),
                logprobs=logprobs,
                finish_reason=row["finish_reason"],
                flags=orjson.loads(row["flags"]),
                tags=orjson.loads(row["tags"]),
                harness_ids=_harness_ids(row),
                **body,
            )
        except (ValidationError, orjson.JSONDecodeError, TypeError) as exc:
            raise CorruptRecord(cid, f"fields do not validate: {exc}") from exc

    def prompt(self, row: sqlite3.Row) -> np.ndarray:
        """The row's whole prompt, rebuilt along its chain of bases, every link checked."""
        chain = [row]
        prefix = np.zeros(0, dtype=np.int32)
        while (base_id := chain[-1]["prompt_base"]) is not None:
            cached = self._cache.get(base_id)
            if cached is not None:
                _check_base(chain[-1], cached[1])
                prefix = cached[0]
                break
            base = self._fetch(base_id)
            if base is None:
                raise CorruptRecord(chain[-1]["completion_id"], f"prompt base {base_id} is missing")
            _check_base(chain[-1], base)
            chain.append(base)
        for link in reversed(chain):
            prefix = self._rebuilt(link, prefix)
        return prefix

    def _rebuilt(self, row: sqlite3.Row, base: np.ndarray) -> np.ndarray:
        cid = row["completion_id"]
        try:
            suffix = blob_to_ids(row["prompt_suffix"])
        except ValueError as exc:
            raise CorruptRecord(cid, f"undecodable prompt suffix: {exc}") from exc
        shared = row["prompt_prefix_len"] if row["prompt_base"] is not None else 0
        prompt = np.concatenate([base[:shared], suffix]) if shared else suffix
        if len(prompt) != row["n_prompt"]:
            raise CorruptRecord(
                cid, f"prompt rebuilds to {len(prompt)} ids, the row says {row['n_prompt']}"
            )
        meta = {k: row[k] for k in ("completion_id", "session_id", "seq", "n_prompt")}
        self._cache[cid] = (prompt, meta)
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return prompt


def _harness_ids(row: sqlite3.Row) -> HarnessIds | None:
    """The row's harness ids; a store read before its migration has no such column."""
    try:
        value = row["harness_ids"]
    except IndexError:
        return None
    return None if value is None else HarnessIds.model_validate_json(value)


def _check_base(child: Any, base: Any) -> None:
    """A base must be an earlier call of the same session with at least the shared prefix."""
    cid, base_id = child["completion_id"], base["completion_id"]
    if base["session_id"] != child["session_id"]:
        raise CorruptRecord(cid, f"prompt base {base_id} belongs to another session")
    if base["seq"] >= child["seq"]:
        raise CorruptRecord(cid, f"prompt base {base_id} is not an earlier call")
    if child["prompt_prefix_len"] > base["n_prompt"]:
        raise CorruptRecord(
            cid,
            f"shares {child['prompt_prefix_len']} ids with base {base_id}, "
            f"whose prompt has {base['n_prompt']}",
        )
