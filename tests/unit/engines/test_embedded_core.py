"""The embedded engine core on the tiny model: faithfulness, prefix reuse, stops, weights."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from polar.engines.embedded.core import EmbeddedEngineCore
from polar.engines.embedded.loader import load_model
from polar.engines.embedded.sampling import GenerationParams, Sampler, StepOutput
from polar.errors import EngineUnavailable, InvalidRequest, RateLimited

HELLO = [{"role": "user", "content": "Hello there, who are you?"}]


@pytest.fixture(scope="module")
def core() -> Iterator[EmbeddedEngineCore]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = EmbeddedEngineCore(load_model("tiny"), prefill_chunk=16)
    yield engine
    engine.close()
    torch.set_num_threads(threads)


def teacher_forced(core: EmbeddedEngineCore, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    """Logprobs of ``sampled`` after ``prompt`` from one plain forward pass, no cache."""
    ids = torch.tensor([prompt + sampled])
    with torch.inference_mode():
        logits = core.module(input_ids=ids).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return steps.gather(-1, torch.tensor(sampled)[:, None]).squeeze(-1)


class ForcedSampler(Sampler):
    """Emits fixed ids (with their real logprobs), to drive the text-side logic."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(GenerationParams(temperature=0.0))
        self.ids = list(ids)

    def step(self, logits: torch.Tensor) -> StepOutput:
        token = torch.tensor([self.ids.pop(0)])
        logprob = torch.log_softmax(logits.float(), -1)[0, token]
        return StepOutput(token, logprob)


def forced(core: EmbeddedEngineCore, text: str, **kwargs: Any) -> Any:
    ids = [*core.encode(text, add_special_tokens=False), 2]
    job = core.prepare(HELLO, params=GenerationParams(max_tokens=len(ids)), **kwargs)
    job.sampler = ForcedSampler(ids)
    return core.submit(job).result(timeout=30), ids


def test_prompt_ids_are_the_chat_template_rendering(core: EmbeddedEngineCore) -> None:
    result = core.generate_sync(HELLO, params=GenerationParams(max_tokens=2, temperature=0))
    expected = core.tokenizer.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    assert result.prompt_ids == core.tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert core.tokenizer.decode(result.prompt_ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(max_tokens=24, temperature=0),
        GenerationParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=5),
    ],
)
def test_logprobs_equal_a_teacher_forced_recomputation(
    core: EmbeddedEngineCore, params: GenerationParams
) -> None:
    result = core.generate_sync(HELLO, params=params)
    choice = result.choices[0]
    assert len(choice.token_ids) == len(choice.logprobs) > 0
    expected = teacher_forced(core, result.prompt_ids, choice.token_ids)
    assert torch.max(torch.abs(torch.tensor(choice.logprobs) - expected)) < 1e-4


def test_processed_mode_reports_logprobs_of_the_tempered_distribution() -> None:
    engine = EmbeddedEngineCore(load_model("tiny"), logprobs_mode="processed")
    try:
        result = engine.generate_sync(
            HELLO, params=GenerationParams(max_tokens=8, temperature=0.5, seed=1)
        )
    finally:
        engine.close()
    choice = result.choices[0]
    ids = torch.tensor([result.prompt_ids + choice.token_ids])
    with torch.inference_mode():
        logits = engine.module(input_ids=ids).logits[0, len(result.prompt_ids) - 1 : -1].float()
    expected = torch.log_softmax(logits / 0.5, -1).gather(
        -1, torch.tensor(choice.token_ids)[:, None]
    )
    assert torch.max(torch.abs(torch.tensor(choice.logprobs) - expected.squeeze(-1))) < 1e-4
    assert result.sampling["logprobs_mode"] == "processed"


def test_second_turn_reuses_the_prefix_and_stays_faithful(core: EmbeddedEngineCore) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    first_turn = [system, {"role": "user", "content": "List three prime numbers."}]
    params = GenerationParams(max_tokens=12, temperature=0.8, seed=3)
    first = core.generate_sync(first_turn, params=params)
    reply = first.choices[0]
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": reply.text},
        {"role": "user", "content": "And three more?"},
    ]
    second = core.generate_sync(second_turn, params=params)
    assert second.timing["reused_prefix_tokens"] >= len(first.prompt_ids)
    expected = teacher_forced(core, second.prompt_ids, second.choices[0].token_ids)
    got = torch.tensor(second.choices[0].logprobs)
    assert torch.max(torch.abs(got - expected)) < 1e-4


def test_same_seed_reproduces_with_or_without_a_cached_prefix(core: EmbeddedEngineCore) -> None:
    params = GenerationParams(max_tokens=10, temperature=1.0, seed=42)
    messages = [{"role": "user", "content": "Seeded sampling check."}]
    a = core.generate_sync(messages, params=params)
    b = core.generate_sync(messages, params=params)
    assert b.timing["reused_prefix_tokens"] > 0
    assert a.choices[0].token_ids == b.choices[0].token_ids
    assert a.sampling["seed"] == 42


def test_length_stop_and_recorded_sampling(core: EmbeddedEngineCore) -> None:
    params = GenerationParams(max_tokens=5, temperature=0.7, top_k=50, seed=1, ignore_eos=True)
    result = core.generate_sync(HELLO, params=params)
    choice = result.choices[0]
    assert choice.finish_reason == "length" and len(choice.token_ids) == 5
    assert result.sampling["max_tokens"] == 5 and result.sampling["top_k"] == 50
    assert result.policy_version == core.policy_version


def test_max_tokens_defaults_to_the_rest_of_the_context(core: EmbeddedEngineCore) -> None:
    job = core.prepare(HELLO)
    assert job.max_tokens == core.max_model_len - len(job.prompt.ids)


def test_stop_token_ids_and_stop_strings(core: EmbeddedEngineCore) -> None:
    sampled = GenerationParams(max_tokens=12, temperature=1.0, seed=13, ignore_eos=True)
    ids = core.generate_sync(HELLO, params=sampled).choices[0].token_ids
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    by_id = core.generate_sync(
        HELLO,
        params=GenerationParams(max_tokens=12, temperature=1.0, seed=13, stop_token_ids=(ids[k],)),
    )
    assert by_id.choices[0].token_ids == ids[: k + 1]
    assert by_id.choices[0].finish_reason == "stop" and by_id.choices[0].stop_reason == ids[k]

    texts = [core.decode(ids[: i + 1], skip_special_tokens=True) for i in range(len(ids))]
    j = next(
        i
        for i in range(1, len(ids))
        if texts[i][len(texts[i - 1]) :].strip()
        and texts[i][len(texts[i - 1]) :] not in texts[i - 1]
    )
    stop = texts[j][len(texts[j - 1]) :]
    by_text = core.generate_sync(
        HELLO, params=GenerationParams(max_tokens=12, temperature=1.0, seed=13, stop=(stop,))
    )
    choice = by_text.choices[0]
    assert choice.token_ids == ids[: j + 1]
    assert choice.finish_reason == "stop" and choice.stop_reason == stop
    assert choice.text == texts[j - 1]


def test_n_choices_share_the_prompt(core: EmbeddedEngineCore) -> None:
    result = core.generate_sync(
        HELLO, params=GenerationParams(max_tokens=6, temperature=1.0, seed=9, n=3)
    )
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in result.choices}) > 1
    for choice in result.choices:
        expected = teacher_forced(core, result.prompt_ids, choice.token_ids)
        assert torch.max(torch.abs(torch.tensor(choice.logprobs) - expected)) < 1e-4


def test_concurrent_requests_decode_in_one_batch_and_stay_faithful(
    core: EmbeddedEngineCore,
) -> None:
    before = core.stats()["batched_decode"]
    conversations = [
        [{"role": "user", "content": "Short."}],
        [{"role": "user", "content": "A much longer question about many things. " * 6}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Why?"}],
    ]
    params = [
        GenerationParams(max_tokens=20, temperature=0, ignore_eos=True),
        GenerationParams(max_tokens=7, temperature=0.9, seed=1, ignore_eos=True),
        GenerationParams(max_tokens=14, temperature=1.2, top_k=40, seed=2, n=2),
    ]
    jobs = [core.prepare(m, params=p) for m, p in zip(conversations, params, strict=True)]
    with core.weights_update(bump=False):  # queue all three, then let them run together
        futures = [core.submit(job) for job in jobs]
    results = [f.result(timeout=60) for f in futures]
    after = core.stats()["batched_decode"]
    assert after["rows"] - before["rows"] > after["steps"] - before["steps"]  # rows shared steps
    assert [len(r.choices[0].token_ids) for r in results[:2]] == [20, 7]
    for result in results:
        for choice in result.choices:
            expected = teacher_forced(core, result.prompt_ids, choice.token_ids)
            assert torch.max(torch.abs(torch.tensor(choice.logprobs) - expected)) < 1e-4


def test_tool_calls_are_parsed_out_of_sampled_text_without_changing_ids(
    core: EmbeddedEngineCore,
) -> None:
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    job = core.prepare(HELLO, tools)
    assert "<tools>" in job.prompt.text and '"name": "read"' in job.prompt.text

    text = 'Reading.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>'
    result, ids = forced(core, text, tools=tools)
    choice = result.choices[0]
    assert choice.token_ids == ids
    assert choice.finish_reason == "tool_calls" and choice.content == "Reading."
    assert choice.tool_calls[0]["function"] == {"name": "read", "arguments": '{"path": "a.txt"}'}

    broken = "<tool_call>\n{not json}\n</tool_call>"
    result, ids = forced(core, broken, tools=tools)
    assert result.choices[0].tool_calls == [] and result.choices[0].content == broken
    assert result.choices[0].finish_reason == "stop" and result.choices[0].token_ids == ids

    result, _ = forced(core, text, tools=tools, tool_choice="none")
    assert result.choices[0].tool_calls == [] and result.choices[0].content == text


def test_past_tool_calls_render_as_the_text_the_model_samples(core: EmbeddedEngineCore) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "a"}'},
    }
    messages = [
        *HELLO,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "file body"},
    ]
    text = core.render(messages).text
    assert (
        '<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n</tool_call><|im_end|>' in text
    )
    assert "<tool_response>\nfile body\n</tool_response>" in text


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "robot", "content": "x"}],
        ["hello"],
        [{"role": "assistant", "tool_calls": [{"x": 1}]}],
    ],
)
def test_malformed_messages_are_invalid_requests(core: EmbeddedEngineCore, messages: Any) -> None:
    with pytest.raises(InvalidRequest):
        core.prepare(messages)


def test_context_overflow_is_a_clear_invalid_request(core: EmbeddedEngineCore) -> None:
    with pytest.raises(InvalidRequest, match="maximum context length is 8192"):
        core.prepare(HELLO, params=GenerationParams(max_tokens=8190))
    huge = [{"role": "user", "content": "word " * 9000}]
    with pytest.raises(InvalidRequest, match="maximum context length"):
        core.prepare(huge)


def test_weights_update_waits_bumps_the_version_and_clears_the_prefix_cache(
    core: EmbeddedEngineCore,
) -> None:
    params = GenerationParams(max_tokens=30, temperature=0, ignore_eos=True)
    core.generate_sync(HELLO, params=GenerationParams(max_tokens=2, temperature=0))
    assert len(core.prefix_cache) > 0
    version = core.policy_version
    in_flight = core.submit(core.prepare(HELLO, params=params))
    while core.stats()["waiting"] or not core.stats()["active"]:
        time.sleep(0.001)  # until it has started
    with core.weights_update() as module:
        assert in_flight.done()  # it finished before the update began
        # Stale from here on, so freed before the update allocates (not after it).
        assert len(core.prefix_cache) == 0 and core.prefix_cache.nbytes == 0
        with torch.no_grad():
            module.model.norm.weight.mul_(1.5)
        queued = core.submit(
            core.prepare(HELLO, params=GenerationParams(max_tokens=4, temperature=0))
        )
        time.sleep(0.05)
        assert not queued.done()  # held back during the update
    assert in_flight.result().policy_version == version
    after = queued.result(timeout=30)
    assert after.policy_version == version + 1 == core.policy_version
    assert after.timing["reused_prefix_tokens"] == 0
    expected = teacher_forced(core, after.prompt_ids, after.choices[0].token_ids)
    assert torch.max(torch.abs(torch.tensor(after.choices[0].logprobs) - expected)) < 1e-4
    assert core.bump_policy_version() == version + 2 and len(core.prefix_cache) == 0


def test_full_queue_refuses_with_retry_after() -> None:
    engine = EmbeddedEngineCore(load_model("tiny"), max_queue=1, max_active=1)
    try:
        with engine.weights_update(bump=False):
            engine.submit(engine.prepare(HELLO, params=GenerationParams(max_tokens=1)))
            with pytest.raises(RateLimited) as info:
                engine.submit(engine.prepare(HELLO, params=GenerationParams(max_tokens=1)))
        assert info.value.status == 429 and info.value.retry_after is not None
        assert info.value.retry_after >= 1
    finally:
        engine.close()
    with pytest.raises(EngineUnavailable):
        engine.submit(engine.prepare(HELLO))


def test_close_fails_waiting_requests_with_503() -> None:
    engine = EmbeddedEngineCore(load_model("tiny"))
    with engine.weights_update(bump=False):
        waiting = engine.submit(engine.prepare(HELLO, params=GenerationParams(max_tokens=1)))
        closer = threading.Thread(target=engine.close)
        closer.start()
        closer.join(timeout=10)
    with pytest.raises(EngineUnavailable):
        waiting.result(timeout=10)


async def test_short_requests_overtake_long_ones_and_the_loop_keeps_running(
    core: EmbeddedEngineCore,
) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    finished: list[str] = []

    async def run(name: str, max_tokens: int) -> None:
        params = GenerationParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        await core.generate(HELLO, params=params)
        finished.append(name)

    tick = asyncio.create_task(ticker())
    long = asyncio.create_task(run("long", 200))
    await asyncio.sleep(0.05)
    await asyncio.gather(run("short", 3), *(run(f"s{i}", 2) for i in range(5)), long)
    tick.cancel()
    assert finished[-1] == "long" and finished.index("short") < len(finished) - 1
    assert ticks > 10


async def test_a_cancelled_request_is_dropped_and_its_batch_neighbour_unharmed(
    core: EmbeddedEngineCore,
) -> None:
    endless = GenerationParams(max_tokens=5000, temperature=0, ignore_eos=True)
    task = asyncio.create_task(core.generate(HELLO, params=endless))
    neighbour_params = GenerationParams(max_tokens=60, temperature=0.8, seed=3, ignore_eos=True)
    neighbour = asyncio.create_task(core.generate(HELLO, params=neighbour_params))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = await neighbour
    expected = teacher_forced(core, result.prompt_ids, result.choices[0].token_ids)
    assert torch.max(torch.abs(torch.tensor(result.choices[0].logprobs) - expected)) < 1e-4
    deadline = time.monotonic() + 5
    while core.stats()["active"] and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert core.stats()["active"] == 0


class FailingSampler(Sampler):
    def step(self, logits: torch.Tensor) -> StepOutput:
        raise RuntimeError("sampler exploded")


def test_a_failing_request_fails_alone(core: EmbeddedEngineCore) -> None:
    steady = core.prepare(
        HELLO, params=GenerationParams(max_tokens=30, temperature=0, ignore_eos=True)
    )
    broken = core.prepare(HELLO, params=GenerationParams(max_tokens=30))
    broken.sampler = FailingSampler(GenerationParams())
    with core.weights_update(bump=False):
        steady_future = core.submit(steady)
        broken_future = core.submit(broken)
    with pytest.raises(RuntimeError, match="sampler exploded"):
        broken_future.result(timeout=30)
    assert len(steady_future.result(timeout=30).choices[0].token_ids) == 30


def test_generating_raises_no_library_warning(core: EmbeddedEngineCore) -> None:
    """The engine hands transformers its cache under the name the installed version wants:
    the old ``past_key_values`` is a FutureWarning at every forward pass in transformers 5,
    printed among the quickstart's progress lines."""
    conversations = [HELLO, [{"role": "user", "content": "Another question, a longer one."}]]
    params = GenerationParams(max_tokens=6, temperature=0, ignore_eos=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # prefill (a buffer cache) and a batched decode step (the batch cache), on the
        # engine's own thread as in a run
        jobs = [core.prepare(m, params=params) for m in conversations]
        with core.weights_update(bump=False):
            futures = [core.submit(job) for job in jobs]
        for future in futures:
            future.result(timeout=60)
    assert [str(w.message) for w in caught] == []
