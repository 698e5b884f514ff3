"""Malformed engine token fields are the engine's fault: a 502 with a flag, never a Python error."""

from __future__ import annotations

from typing import Any

import pytest

from polar.engines.capture import capture_from_response
from polar.errors import MalformedEngineReply


def _reply(**choice: Any) -> dict[str, Any]:
    base = {"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    return {
        "id": "chatcmpl-1",
        "prompt_token_ids": [1, 2, 3],
        "choices": [base | choice],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }


def test_a_well_formed_reply_still_captures_exactly():
    entries = [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": 0}]
    completion, tokens = capture_from_response(
        _reply(token_ids=[5, 6], logprobs={"content": entries})
    )
    assert (tokens.prompt_ids, tokens.sampled_ids, tokens.logprobs) == (
        [1, 2, 3],
        [5, 6],
        [-0.5, 0.0],
    )
    assert tokens.flags == [] and completion.id == "chatcmpl-1"


@pytest.mark.parametrize(
    ("reply", "names"),
    [
        ({**_reply(token_ids=[5, 6]), "prompt_token_ids": [1, "x", 3]}, "prompt_token_ids[1]"),
        ({**_reply(token_ids=[5, 6]), "prompt_token_ids": "1,2,3"}, "prompt_token_ids is str"),
        (_reply(token_ids=[5, 6.5]), "token_ids[1]"),
        (_reply(token_ids=[5, True]), "token_ids[1]"),
        (_reply(token_ids=[5, 6], logprobs={"content": [{"logprob": "low"}] * 2}), "logprob"),
        (_reply(token_ids=[5, 6], logprobs={"content": [{"token": "a"}] * 2}), "logprob"),
        (_reply(token_ids=[5, 6], logprobs={"content": "nope"}), "logprobs.content"),
        (_reply(token_ids=[5, 6], logprobs=[1, 2]), "logprobs is list"),
        (_reply(meta_info={"output_token_logprobs": [[-0.1]]}), "output_token_logprobs"),
        (_reply(meta_info="x"), "meta_info is str"),
        (_reply(logprobs={"content": [{"token_id": "7", "logprob": -1.0}]}), "token_ids[0]"),
    ],
)
def test_malformed_token_fields_are_a_502_naming_the_field(reply, names):
    with pytest.raises(MalformedEngineReply) as raised:
        capture_from_response(reply)
    err = raised.value
    assert err.status == 502 and err.flag == "engine_reply_malformed"
    assert names in err.message
    assert "Traceback" not in err.message and "Error(" not in err.message


def test_other_unreadable_shapes_are_502_too():
    reply = {**_reply(token_ids=[5]), "usage": {"prompt_tokens": "many"}}
    with pytest.raises(MalformedEngineReply, match="unreadable field"):
        capture_from_response(reply)
