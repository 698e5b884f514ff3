"""Map any engine's chat-completions reply (vLLM, SGLang, embedded) into one canonical capture.

vLLM puts prompt ids at the top level and sampled ids on each choice; SGLang carries the token
id inside each logprob entry (or, in older releases, in ``meta_info`` triples). One parser
serves them all, and every gap or fallback becomes a flag on the record instead of a guess.
A token field that is present but malformed (a string among ids, a logprob that is not a number)
cannot be captured exactly: the call fails with :class:`MalformedEngineReply` (HTTP 502, flag
``engine_reply_malformed``), never with a Python error.
"""

from __future__ import annotations

import math
import time
from typing import Any

from polar.engines.types import TokenCapture
from polar.errors import EngineError, MalformedEngineReply
from polar.providers.base import arguments_text, new_id
from polar.providers.types import FINISH_REASONS, Completion, TokenLogprob, ToolCall
from polar.schemas.flags import (
    FLAG_LOGPROBS_MISALIGNED,
    FLAG_LOGPROBS_MISSING,
    FLAG_PROMPT_IDS_MISSING,
    FLAG_SAMPLED_IDS_FROM_TOKEN_STRINGS,
    FLAG_SAMPLED_IDS_MISSING,
    FLAG_USAGE_MISMATCH,
)

MAX_TOKEN_ID = 2**31 - 1  # the capture store keeps ids as int32


def capture_from_response(body: Any) -> tuple[Completion, TokenCapture]:
    """The normalized completion and token capture of choice 0 of an engine reply."""
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("choices"), list)
        or not body["choices"]
    ):
        raise EngineError("engine reply has no choices")
    choice = body["choices"][0]
    if not isinstance(choice, dict):
        raise EngineError("engine reply choice is not an object")
    try:
        completion = _completion(body, choice)
        tokens = _tokens(body, choice, completion.completion_tokens)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        # A shape no check below names (an object where a list belongs, ...): still the
        # engine's fault, still a 502, with the Python detail left in the log.
        raise MalformedEngineReply(
            f"engine reply has an unreadable field ({type(exc).__name__})"
        ) from exc
    if not completion.completion_tokens:
        completion.completion_tokens = len(tokens.sampled_ids)
    if not completion.prompt_tokens:
        completion.prompt_tokens = len(tokens.prompt_ids)
    completion.logprobs = _token_logprobs(choice, tokens.logprobs)
    return completion, tokens


def _token_logprobs(choice: dict[str, Any], logprobs: list[float] | None) -> list[TokenLogprob]:
    """The sampled tokens' text and logprobs as the engine named them (empty when it sent
    none aligned with its sampled ids)."""
    entries = (choice.get("logprobs") or {}).get("content") if logprobs is not None else None
    if not entries or len(entries) != len(logprobs or ()):
        return []
    return [
        TokenLogprob(str(entry.get("token") or ""), value)
        for entry, value in zip(entries, logprobs or (), strict=True)
    ]


def _completion(body: dict[str, Any], choice: dict[str, Any]) -> Completion:
    message = choice.get("message") or {}
    calls = [
        ToolCall(
            id=str(c.get("id") or new_id("call_")),
            name=str((c.get("function") or {}).get("name", "")),
            arguments=arguments_text((c.get("function") or {}).get("arguments")),
        )
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    finish = choice.get("finish_reason") or "stop"
    if finish not in FINISH_REASONS:
        finish = "stop"
    if calls and finish == "stop":
        finish = "tool_calls"
    usage = body.get("usage") or {}
    return Completion(
        id=str(body.get("id") or new_id("chatcmpl-")),
        model=str(body.get("model") or ""),
        content=message.get("content") or "",
        reasoning=message.get("reasoning_content") or message.get("reasoning") or None,
        tool_calls=calls,
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        created=int(body.get("created") or time.time()),
        # vLLM names the matched stop string in stop_reason (an int is a stop token id).
        stop_sequence=stop if isinstance(stop := choice.get("stop_reason"), str) else None,
    )


def _tokens(body: dict[str, Any], choice: dict[str, Any], usage_completion: int) -> TokenCapture:
    flags: list[str] = []
    entries = _entries(_object(choice.get("logprobs"), "logprobs").get("content"))
    meta = _object(choice.get("meta_info") or body.get("meta_info"), "meta_info")
    triples = _triples(meta.get("output_token_logprobs"))

    prompt = body.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if prompt is None:
        prompt = meta.get("prompt_token_ids") or meta.get("input_ids")
    if prompt is None:
        flags.append(FLAG_PROMPT_IDS_MISSING)

    sampled = choice.get("token_ids") or choice.get("output_ids")
    if sampled is None and entries and all("token_id" in e for e in entries):
        sampled = [e["token_id"] for e in entries]
    if sampled is None and triples:
        sampled = [t[1] for t in triples]
    if sampled is None and entries:
        parsed = [_id_from_token_string(e.get("token")) for e in entries]
        if all(p is not None for p in parsed):
            sampled = parsed
            flags.append(FLAG_SAMPLED_IDS_FROM_TOKEN_STRINGS)
    if sampled is None:
        flags.append(FLAG_SAMPLED_IDS_MISSING)
        sampled = []

    logprobs: list[float] | None = None
    if entries is not None:
        logprobs = [
            _logprob(e.get("logprob"), f"logprobs.content[{i}]") for i, e in enumerate(entries)
        ]
    elif triples:
        logprobs = [_logprob(t[0], f"output_token_logprobs[{i}]") for i, t in enumerate(triples)]
    if logprobs is None:
        flags.append(FLAG_LOGPROBS_MISSING)
    elif len(logprobs) != len(sampled):
        flags.append(FLAG_LOGPROBS_MISALIGNED)
        logprobs = None

    if usage_completion and usage_completion != len(sampled):
        flags.append(FLAG_USAGE_MISMATCH)
    return TokenCapture(
        prompt_ids=_ids(prompt or [], "prompt_token_ids"),
        sampled_ids=_ids(sampled, "token_ids"),
        logprobs=logprobs,
        flags=flags,
    )


def _malformed(what: str) -> MalformedEngineReply:
    return MalformedEngineReply(f"engine reply has malformed token fields: {what}")


def _ids(values: Any, field: str) -> list[int]:
    """Token ids exactly as the engine sent them: a list of JSON integers."""
    if not isinstance(values, list):
        raise _malformed(f"{field} is {type(values).__name__}, not a list of token ids")
    # Checked at C speed (~15 ns an id); the loop only names the culprit.
    if values and set(map(type, values)) != {int}:
        i, t = next((i, t) for i, t in enumerate(values) if type(t) is not int)
        raise _malformed(f"{field}[{i}] is {str(t)[:40]!r}, not a token id")
    check_id_range(values, field)
    return values


def check_id_range(ids: list[int], field: str) -> None:
    """:class:`MalformedEngineReply` for an id the capture store cannot hold exactly (negative,
    or past int32), so the engine's fault is a 502 before the store would refuse it."""
    if ids and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
        i, t = next((i, t) for i, t in enumerate(ids) if not 0 <= t <= MAX_TOKEN_ID)
        raise _malformed(f"{field}[{i}] is {str(t)[:40]}: token ids run from 0 to {MAX_TOKEN_ID}")


def _object(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed(f"{field} is {type(value).__name__}, not an object")
    return value


def _entries(value: Any) -> list[dict[str, Any]] | None:
    """``logprobs.content``: one object per sampled token (or absent)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise _malformed("logprobs.content is not a list of objects")
    return value


def _triples(value: Any) -> list[list[Any]] | None:
    """SGLang's ``output_token_logprobs``: ``[logprob, token_id, text]`` per sampled token."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(t, list | tuple) and len(t) >= 2 for t in value
    ):
        raise _malformed("meta_info.output_token_logprobs is not a list of [logprob, id, ...]")
    return value


def _logprob(value: Any, field: str) -> float:
    if type(value) not in (int, float) or math.isnan(value):
        raise _malformed(f"{field}.logprob is {str(value)[:40]!r}, not a log-probability")
    return float(value)


def _id_from_token_string(token: Any) -> int | None:
    """vLLM's ``return_tokens_as_token_ids`` renders tokens as ``"token_id:N"``."""
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:") :])
        except ValueError:
            return None
    return None
