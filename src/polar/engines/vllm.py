"""vLLM's OpenAI-compatible server (v0.10.2+): the flags that return token ids and logprobs."""

from __future__ import annotations

from typing import Any, ClassVar

from polar.engines.openai_compat import OpenAICompatEngine


class VLLMEngine(OpenAICompatEngine):
    """vLLM needs ``top_logprobs`` set for ``logprobs.content`` to be filled."""

    name: ClassVar[str] = "vllm"
    token_flags: ClassVar[dict[str, Any]] = {
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 0,
    }
