from __future__ import annotations

import pytest

from polar.engines.capture import capture_from_response
from polar.errors import EngineError
from polar.schemas.flags import (
    FLAG_LOGPROBS_MISALIGNED,
    FLAG_LOGPROBS_MISSING,
    FLAG_PROMPT_IDS_MISSING,
    FLAG_SAMPLED_IDS_FROM_TOKEN_STRINGS,
    FLAG_USAGE_MISMATCH,
)


def _message(**kw):
    return {"role": "assistant", "content": "hi", **kw}


def test_vllm_shape():
    body = {
        "id": "chatcmpl-1",
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "message": _message(),
                "finish_reason": "stop",
                "token_ids": [10, 2],
                "logprobs": {
                    "content": [
                        {"token": "hi", "logprob": -0.5},
                        {"token": "<|im_end|>", "logprob": -0.01},
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    completion, tokens = capture_from_response(body)
    assert (tokens.prompt_ids, tokens.sampled_ids, tokens.logprobs) == (
        [1, 2, 3],
        [10, 2],
        [-0.5, -0.01],
    )
    assert tokens.flags == []
    assert completion.content == "hi" and completion.finish_reason == "stop"


def test_sglang_token_id_in_logprob_entries_matches_vllm():
    entries = [
        {"token": "hi", "logprob": -0.5, "token_id": 10},
        {"token": "x", "logprob": -0.01, "token_id": 2},
    ]
    body = {
        "choices": [
            {
                "message": _message(),
                "finish_reason": "stop",
                "prompt_token_ids": [1, 2, 3],
                "logprobs": {"content": entries},
            }
        ],
        "usage": {"completion_tokens": 2},
    }
    _, tokens = capture_from_response(body)
    assert (tokens.prompt_ids, tokens.sampled_ids, tokens.logprobs, tokens.flags) == (
        [1, 2, 3],
        [10, 2],
        [-0.5, -0.01],
        [],
    )


def test_sglang_meta_info_triples():
    body = {
        "choices": [{"message": _message(), "finish_reason": "length"}],
        "meta_info": {
            "prompt_token_ids": [4],
            "output_token_logprobs": [[-0.1, 7, "a"], [-0.2, 8, "b"]],
        },
    }
    _, tokens = capture_from_response(body)
    assert (tokens.prompt_ids, tokens.sampled_ids, tokens.logprobs) == ([4], [7, 8], [-0.1, -0.2])


def test_fallbacks_and_gaps_are_flagged_never_filled():
    body = {
        "choices": [
            {
                "message": _message(),
                "finish_reason": "stop",
                "logprobs": {"content": [{"token": "token_id:11", "logprob": -1.0}]},
            }
        ],
        "usage": {"completion_tokens": 5},
    }
    _, tokens = capture_from_response(body)
    assert tokens.sampled_ids == [11]
    assert set(tokens.flags) == {
        FLAG_PROMPT_IDS_MISSING,
        FLAG_SAMPLED_IDS_FROM_TOKEN_STRINGS,
        FLAG_USAGE_MISMATCH,
    }


def test_misaligned_or_missing_logprobs_are_dropped_and_flagged():
    body = {
        "prompt_token_ids": [1],
        "choices": [
            {
                "message": _message(),
                "token_ids": [5, 6],
                "logprobs": {"content": [{"logprob": -1.0}]},
            }
        ],
    }
    _, tokens = capture_from_response(body)
    assert tokens.logprobs is None and FLAG_LOGPROBS_MISALIGNED in tokens.flags
    body["choices"][0].pop("logprobs")
    _, tokens = capture_from_response(body)
    assert tokens.logprobs is None and FLAG_LOGPROBS_MISSING in tokens.flags


def test_tool_calls_force_tool_calls_finish_and_dict_arguments_become_text():
    body = {
        "prompt_token_ids": [1],
        "choices": [
            {
                "message": _message(
                    tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}]
                ),
                "finish_reason": "stop",
                "token_ids": [3],
                "logprobs": {"content": [{"logprob": -0.3}]},
            }
        ],
    }
    completion, _ = capture_from_response(body)
    assert completion.finish_reason == "tool_calls"
    assert completion.tool_calls[0].arguments == '{"a":1}'


@pytest.mark.parametrize("body", [None, [], {}, {"choices": []}, {"choices": ["x"]}])
def test_unusable_replies_raise_engine_error(body):
    with pytest.raises(EngineError):
        capture_from_response(body)
