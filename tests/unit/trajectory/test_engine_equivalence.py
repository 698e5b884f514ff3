"""vLLM-shaped and SGLang-shaped captures of one session build identical trajectories.

Each call of a real-template session is answered in three wire shapes (vLLM's top-level
``prompt_token_ids`` + choice ``token_ids``; SGLang's logprob entries carrying ``token_id``;
older SGLang's ``meta_info.output_token_logprobs`` triples), mapped by the canonical
``polar.engines.capture.capture_from_response``, and built.
"""

from __future__ import annotations

from typing import Any

import pytest

from polar.capture.records import CaptureRecord
from polar.engines.capture import capture_from_response
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from .sessions import TOOLS, Agent


def vllm_body(rec: CaptureRecord, tok: Any) -> dict[str, Any]:
    return {
        "id": rec.completion_id,
        "model": "m",
        "prompt_token_ids": rec.prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": rec.response["content"]},
                "finish_reason": rec.finish_reason,
                "token_ids": rec.sampled_ids,
                "logprobs": {
                    "content": [
                        {"token": tok.decode([t]), "logprob": lp, "bytes": [], "top_logprobs": []}
                        for t, lp in zip(rec.sampled_ids, rec.logprobs or [], strict=True)
                    ]
                },
            }
        ],
    }


def sglang_body(rec: CaptureRecord, tok: Any) -> dict[str, Any]:
    return {
        "id": rec.completion_id,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": rec.response["content"]},
                "finish_reason": rec.finish_reason,
                "prompt_token_ids": rec.prompt_ids,
                "logprobs": {
                    "content": [
                        {"token": tok.decode([t]), "token_id": t, "logprob": lp, "top_logprobs": []}
                        for t, lp in zip(rec.sampled_ids, rec.logprobs or [], strict=True)
                    ]
                },
            }
        ],
    }


def sglang_meta_body(rec: CaptureRecord, tok: Any) -> dict[str, Any]:
    return {
        "id": rec.completion_id,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": rec.response["content"]},
                "finish_reason": rec.finish_reason,
                "meta_info": {
                    "input_ids": rec.prompt_ids,
                    "output_token_logprobs": [
                        [lp, t, tok.decode([t])]
                        for t, lp in zip(rec.sampled_ids, rec.logprobs or [], strict=True)
                    ],
                },
            }
        ],
    }


def recapture(rec: CaptureRecord, body: dict[str, Any]) -> CaptureRecord:
    completion, tokens = capture_from_response(body)
    return rec.model_copy(
        update={
            "prompt_ids": tokens.prompt_ids,
            "sampled_ids": tokens.sampled_ids,
            "logprobs": tokens.logprobs,
            "flags": tokens.flags,
            "finish_reason": completion.finish_reason,
            "engine": "shape-under-test",
        }
    )


@pytest.fixture(scope="module")
def session(smollm2: Any) -> list[CaptureRecord]:
    agent = Agent(smollm2, tools=TOOLS)
    agent.call("Let me look.", tool_cmd="ls")
    agent.tool_result("a.py b.py")
    agent.call("Reading.", tool_cmd="cat a.py")
    agent.tool_result("print(1)")
    agent.call("It prints 1.", max_tokens=3)
    agent.user("Continue.")
    agent.call("Done.")
    return agent.records


def test_vllm_and_sglang_shapes_build_identical_traces(session, smollm2):
    built = []
    for shape in (vllm_body, sglang_body, sglang_meta_body):
        records = [recapture(r, shape(r, smollm2)) for r in session]
        assert all(not r.flags for r in records), [r.flags for r in records]
        built.append(PrefixMergingBuilder().build(records))
    vllm, sglang, sglang_meta = built
    assert vllm.traces == sglang.traces == sglang_meta.traces
    assert len(vllm.traces) == 1
    assert vllm.traces[0].metadata["completion_ids"] == [r.completion_id for r in session]
