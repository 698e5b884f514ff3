"""SGLang's OpenAI-compatible server: token ids arrive in logprob entries or meta_info."""

from __future__ import annotations

from typing import Any, ClassVar

from polar.engines.openai_compat import OpenAICompatEngine


class SGLangEngine(OpenAICompatEngine):
    """Asks for prompt and sampled ids (newer releases) and the meta_info triples (older ones)."""

    name: ClassVar[str] = "sglang"
    token_flags: ClassVar[dict[str, Any]] = {
        "logprobs": True,
        "top_logprobs": 0,
        "return_prompt_token_ids": True,
        "return_token_ids": True,
    }
