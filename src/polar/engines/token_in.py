"""Token-in replies: what vLLM's ``/v1/completions`` (given prompt ids) and SGLang's
``/generate`` (given ``input_ids``) return, read into :class:`SampledTokens`.

The gateway rendered the prompt itself, so the sampled ids are the whole truth it needs; a
reply without them cannot be captured and is an engine error (502), never a guess. Logprobs
that do not line up one per sampled id are dropped and flagged, as for chat replies.
"""

from __future__ import annotations

import math
from typing import Any

from polar.engines.capture import check_id_range
from polar.engines.types import SampledTokens
from polar.errors import EngineError
from polar.schemas.flags import (
    FLAG_LOGPROBS_MISALIGNED,
    FLAG_LOGPROBS_MISSING,
    FLAG_PROMPT_ECHO_MISMATCH,
)

_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "eos": "stop"}


def from_vllm_completion(reply: dict[str, Any], body: dict[str, Any]) -> SampledTokens:
    """vLLM (and the embedded and scripted engines): ``choices[0].token_ids`` and
    ``logprobs.token_logprobs``; prompt ids echoed per choice or at the top level."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EngineError("engine reply has no choices")
    choice = choices[0]
    sampled = _ids(choice.get("token_ids"), "choices[0].token_ids")
    entries = choice.get("logprobs")
    raw = entries.get("token_logprobs") if isinstance(entries, dict) else None
    echo = choice.get("prompt_token_ids") or reply.get("prompt_token_ids")
    return _sampled(
        sampled,
        raw,
        str(choice.get("finish_reason") or "stop"),
        echo,
        body,
        reply,
    )


def from_sglang_generate(reply: dict[str, Any], body: dict[str, Any]) -> SampledTokens:
    """SGLang ``/generate``: ``meta_info.output_token_logprobs`` triples ``[logprob, id, _]``
    (ids and logprobs together), else ``output_ids`` without logprobs."""
    raw_meta = reply.get("meta_info")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    triples = meta.get("output_token_logprobs")
    if isinstance(triples, list) and triples:
        sampled = _ids(
            [t[1] if isinstance(t, list) and len(t) > 1 else None for t in triples], "ids"
        )
        raw: Any = [t[0] for t in triples]
    else:
        sampled = _ids(reply.get("output_ids"), "output_ids")
        raw = None
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    return _sampled(sampled, raw, _FINISH.get(str(kind), "stop"), None, body, reply)


def _sampled(
    sampled: list[int],
    raw_logprobs: Any,
    finish: str,
    echo: Any,
    body: dict[str, Any],
    reply: dict[str, Any],
) -> SampledTokens:
    flags: list[str] = []
    logprobs = _logprobs(raw_logprobs, len(sampled), flags)
    sent = body.get("prompt") if "prompt" in body else body.get("input_ids")
    prompt_ids = None
    if isinstance(echo, list) and echo:
        prompt_ids = _ids(echo, "prompt_token_ids")
        if prompt_ids != sent:
            flags.append(FLAG_PROMPT_ECHO_MISMATCH)
    version = reply.get("policy_version")
    return SampledTokens(
        sampled_ids=sampled,
        logprobs=logprobs,
        finish_reason=_FINISH.get(finish, finish),
        prompt_ids=prompt_ids,
        upstream_request={k: v for k, v in body.items() if k not in ("prompt", "input_ids")},
        sampling=dict(reply.get("sampling") or {}),
        flags=flags,
        policy_version=version if isinstance(version, int) else None,
        engine_id=str(reply["id"]) if reply.get("id") else None,
    )


def _ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise EngineError(
            f"engine reply lacks valid token ids at {where}; Polar needs the engine to return "
            "sampled ids (vLLM >= 0.10.2 with return_token_ids, SGLang /generate)"
        )
    check_id_range(value, where)
    return list(value)


def _logprobs(raw: Any, n: int, flags: list[str]) -> list[float] | None:
    if raw is None:
        flags.append(FLAG_LOGPROBS_MISSING)
        return None
    if not isinstance(raw, list) or len(raw) != n:
        flags.append(FLAG_LOGPROBS_MISALIGNED)
        return None
    out = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            flags.append(FLAG_LOGPROBS_MISALIGNED)
            return None
        out.append(float(value))
    return out
