"""SGLang's OpenAI-compatible server: token ids arrive in logprob entries or meta_info."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from polar.engines.openai_compat import OpenAICompatEngine
from polar.engines.token_in import from_sglang_generate
from polar.providers.types import NormalizedRequest, ResponseFormat

# Chat-completions parameter names in SGLang's sampling_params.
_SAMPLING_NAMES = {"max_tokens": "max_new_tokens", "seed": "sampling_seed"}


def sglang_json_schema(response_format: ResponseFormat) -> dict[str, Any]:
    """SGLang's ``sampling_params.json_schema``: the schema as a string (json_object as any
    object, as SGLang's own chat server maps it)."""
    return {"json_schema": json.dumps(response_format.schema_or_object())}


class SGLangEngine(OpenAICompatEngine):
    """Asks for prompt and sampled ids (newer releases) and the meta_info triples (older ones)."""

    name: ClassVar[str] = "sglang"
    token_flags: ClassVar[dict[str, Any]] = {
        "logprobs": True,
        "top_logprobs": 0,
        "return_prompt_token_ids": True,
        "return_token_ids": True,
    }
    token_path: ClassVar[str] = "/generate"
    read_token_reply = staticmethod(from_sglang_generate)
    token_structured_output = staticmethod(sglang_json_schema)  # inside sampling_params
    regex_constraint: ClassVar[str | None] = "sampling_params.regex"

    def build_token_body(self, prompt_ids: list[int], request: NormalizedRequest) -> dict[str, Any]:
        """SGLang's native ``/generate``: ``input_ids`` in, output ids and logprobs out."""
        sampling = {_SAMPLING_NAMES.get(k, k): v for k, v in request.params.as_dict().items()}
        if request.response_format is not None:
            sampling.update(self.token_structured_output(request.response_format))
        if request.forced_call_pattern is not None:
            sampling["regex"] = request.forced_call_pattern
        body: dict[str, Any] = {
            "input_ids": prompt_ids,
            "sampling_params": sampling,
            "return_logprob": True,
            "stream": False,
        }
        body.update(self.extra_body)
        return body
