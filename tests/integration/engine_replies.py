"""Reading the scripted engine's logged replies in both of vLLM's shapes."""

from __future__ import annotations

from typing import Any


def engine_tokens(reply: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, sampled ids, logprobs) of an engine reply as the engine itself sent them:
    a chat completion (engine-side rendering) or a token-prompt completion (gateway-side)."""
    choice = reply["choices"][0]
    if reply.get("object") == "text_completion":
        return choice["prompt_token_ids"], choice["token_ids"], choice["logprobs"]["token_logprobs"]
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    return reply["prompt_token_ids"], choice["token_ids"], logprobs


def gap_flags(flags: list[str]) -> list[str]:
    """A record's flags minus those that only say how its prompt was rendered."""
    return [f for f in flags if f != "rendered_by_gateway" and not f.startswith("prompt_")]
