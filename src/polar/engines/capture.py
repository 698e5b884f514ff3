"""Map any engine's chat-completions reply (vLLM, SGLang, embedded) into one canonical capture.

vLLM puts prompt ids at the top level and sampled ids on each choice; SGLang carries the token
id inside each logprob entry (or, in older releases, in ``meta_info`` triples). One parser
serves them all, and every gap or fallback becomes a flag on the record instead of a guess.
"""

from __future__ import annotations

import time
from typing import Any

from polar.engines.types import (
    FLAG_LOGPROBS_MISALIGNED,
    FLAG_LOGPROBS_MISSING,
    FLAG_PROMPT_IDS_MISSING,
    FLAG_SAMPLED_IDS_FROM_TOKEN_STRINGS,
    FLAG_SAMPLED_IDS_MISSING,
    FLAG_USAGE_MISMATCH,
    TokenCapture,
)
from polar.errors import EngineError
from polar.providers.base import arguments_text, new_id
from polar.providers.types import FINISH_REASONS, Completion, ToolCall


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
    completion = _completion(body, choice)
    tokens = _tokens(body, choice, completion.completion_tokens)
    if not completion.completion_tokens:
        completion.completion_tokens = len(tokens.sampled_ids)
    if not completion.prompt_tokens:
        completion.prompt_tokens = len(tokens.prompt_ids)
    return completion, tokens


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
    )


def _tokens(body: dict[str, Any], choice: dict[str, Any], usage_completion: int) -> TokenCapture:
    flags: list[str] = []
    entries = (choice.get("logprobs") or {}).get("content")
    meta = choice.get("meta_info") or body.get("meta_info") or {}
    triples = meta.get("output_token_logprobs")

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
        logprobs = [float(e["logprob"]) for e in entries]
    elif triples:
        logprobs = [float(t[0]) for t in triples]
    if logprobs is None:
        flags.append(FLAG_LOGPROBS_MISSING)
    elif len(logprobs) != len(sampled):
        flags.append(FLAG_LOGPROBS_MISALIGNED)
        logprobs = None

    if usage_completion and usage_completion != len(sampled):
        flags.append(FLAG_USAGE_MISMATCH)
    return TokenCapture(
        prompt_ids=_ids(prompt or []),
        sampled_ids=_ids(sampled),
        logprobs=logprobs,
        flags=flags,
    )


def _ids(values: list[Any]) -> list[int]:
    """Token ids as ints; JSON already gives ints, so long prompts skip the per-item copy."""
    if isinstance(values, list) and (
        not values or (type(values[0]) is int and type(values[-1]) is int)
    ):
        return values
    return [int(t) for t in values]


def _id_from_token_string(token: Any) -> int | None:
    """vLLM's ``return_tokens_as_token_ids`` renders tokens as ``"token_id:N"``."""
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:") :])
        except ValueError:
            return None
    return None
