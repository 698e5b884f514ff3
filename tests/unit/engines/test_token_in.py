"""Reading token-prompt replies: vLLM's /v1/completions and SGLang's /generate."""

from __future__ import annotations

import pytest

from polar.engines.token_in import (
    FLAG_PROMPT_ECHO_MISMATCH,
    from_sglang_generate,
    from_vllm_completion,
)
from polar.errors import EngineError


def vllm_reply(**choice: object) -> dict:
    base = {
        "index": 0,
        "text": "hi",
        "token_ids": [5, 6, 2],
        "prompt_token_ids": [1, 2, 3],
        "logprobs": {"token_logprobs": [-0.5, -0.25, -0.125]},
        "finish_reason": "stop",
    }
    return {"id": "cmpl-1", "choices": [{**base, **choice}]}


def test_vllm_completion_with_token_ids_is_read_exactly() -> None:
    tokens = from_vllm_completion(vllm_reply(), {"prompt": [1, 2, 3], "max_tokens": 8})
    assert tokens.sampled_ids == [5, 6, 2]
    assert tokens.logprobs == [-0.5, -0.25, -0.125]
    assert tokens.prompt_ids == [1, 2, 3] and tokens.flags == []
    assert tokens.engine_id == "cmpl-1"
    assert "prompt" not in tokens.upstream_request  # the ids live in the record, not twice


def test_a_prompt_echo_that_differs_from_what_was_sent_is_flagged() -> None:
    tokens = from_vllm_completion(vllm_reply(prompt_token_ids=[1, 2, 4]), {"prompt": [1, 2, 3]})
    assert tokens.prompt_ids == [1, 2, 4]  # what the engine says it conditioned on
    assert FLAG_PROMPT_ECHO_MISMATCH in tokens.flags


def test_misaligned_logprobs_are_dropped_and_flagged_never_guessed() -> None:
    tokens = from_vllm_completion(
        vllm_reply(logprobs={"token_logprobs": [-0.5]}), {"prompt": [1, 2, 3]}
    )
    assert tokens.logprobs is None and "logprobs_misaligned" in tokens.flags


@pytest.mark.parametrize("ids", [None, [1, "2"], [1, -3], [True]])
def test_a_reply_without_valid_sampled_ids_is_an_engine_error(ids: object) -> None:
    with pytest.raises(EngineError, match="token ids"):
        from_vllm_completion(vllm_reply(token_ids=ids), {"prompt": [1]})


def test_sglang_generate_reads_ids_and_logprobs_from_the_triples() -> None:
    reply = {
        "text": "hi",
        "output_ids": [5, 6],
        "meta_info": {
            "id": "abc",
            "finish_reason": {"type": "length", "length": 3},
            "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None], [-1.0, 7, None]],
        },
    }
    tokens = from_sglang_generate(reply, {"input_ids": [1, 2], "sampling_params": {}})
    assert tokens.sampled_ids == [5, 6, 7]
    assert tokens.logprobs == [-0.5, -0.25, -1.0]
    assert tokens.finish_reason == "length"
    assert tokens.prompt_ids is None  # SGLang does not echo; the gateway records what it sent
