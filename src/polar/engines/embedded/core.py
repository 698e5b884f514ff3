"""The embedded engine: one model, a fair scheduler thread, prefix reuse, on-policy weights.

All model work runs on one scheduler thread, so the server's event loop never blocks and the
trainer can share the very module being served. Requests wait in a bounded FIFO queue; up to
``max_active`` of them are in flight at once. Each scheduler round runs one prefill chunk for
every request still reading its prompt, then one decode step for every request generating, all
rows in one batched forward pass (a CPU decode step costs about the same for several rows as for
one), so concurrent sessions share the model and a long generation does not starve a short one.
A full queue refuses new work with :class:`RateLimited` and a Retry-After estimate instead of
growing without bound.

Concurrent prompts that begin alike (a GRPO group, a batch of sessions of one harness) share
their prefill: every prompt's keys and values go into the prefix cache as soon as it is read,
a new request starts from the longest prefix that the cache or another request's ongoing
prefill holds, and a request whose prompt mostly repeats one still being read waits for it
instead of computing the same positions again.

Every completion records the policy version that produced it. :meth:`weights_update` lets a
trainer in the same process change the weights between generations: it waits for in-flight
generations to finish, holds new ones back, and on exit drops every cached prefix (their keys
and values belong to the old weights) and bumps the version.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from polar.engines.embedded.kv_cache import (
    BatchCache,
    BufferCache,
    PrefixCache,
    common_prefix_length,
    copy_prefix,
    load_prefix,
    supports_buffer_cache,
)
from polar.engines.embedded.loader import DEFAULT_MODEL, LoadedModel, load_model
from polar.engines.embedded.sampling import LOGPROBS_MODES, GenerationParams, Sampler, StepOutput
from polar.errors import ConfigError, EngineUnavailable, InvalidRequest, RateLimited
from polar.rendering.chat_template import RenderedPrompt, render_prompt
from polar.rendering.renderer import cut_at_stop
from polar.rendering.tool_text import parse_tool_calls

# Decode rows start with room for this many new tokens and grow when a generation needs more.
INITIAL_DECODE_ROOM = 256
# A request waits for another's prefill only to skip at least this many prompt tokens, and at
# least half of what it would otherwise compute.
SHARE_MIN_TOKENS = 32


@dataclass
class ChoiceResult:
    """One sampled continuation. ``token_ids`` are exactly the sampled ids, stop token included."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    token_texts: list[str]
    top_logprobs: list[list[tuple[int, str, float]]] | None
    text: str
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    stop_reason: str | int | None = None


@dataclass
class GenerationResult:
    """A finished request: the prompt ids the model saw and each choice, with provenance."""

    id: str
    model: str
    created: int
    prompt_ids: list[int]
    choices: list[ChoiceResult]
    policy_version: int
    sampling: dict[str, Any]
    timing: dict[str, float | int]


@dataclass
class _Row:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class _Job:
    """One request moving through the scheduler: prefill, then decode (usually batched)."""

    prompt: RenderedPrompt
    params: GenerationParams
    max_tokens: int
    sampler: Sampler
    parse_tools: bool
    single_tool_call: bool = False
    future: Future[GenerationResult] = field(default_factory=Future)
    submitted: float = field(default_factory=time.perf_counter)
    version: int = 0
    started: float = 0.0
    prefilled: float = 0.0
    cache: Any = None  # its own cache while prefilling (and decoding, when not batched)
    position: int = 0  # prompt tokens run so far
    reused: int = 0
    _tokens: np.ndarray | None = None
    rows: list[_Row] = field(default_factory=list)
    sampled: int = 0  # decode steps taken (tokens sampled per row)
    last_tokens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    first_row: int | None = None  # where its rows sit in the decode batch
    decoding: bool = False
    done: bool = False
    failed: bool = False
    outcome: GenerationResult | Exception | None = None

    def rows_slice(self) -> slice:
        start = self.first_row or 0
        return slice(start, start + self.params.n)

    def fail(self, error: Exception) -> None:
        self.outcome, self.done, self.failed = error, True, True

    @property
    def tokens(self) -> np.ndarray:
        """The prompt ids as an array, for prefix comparisons."""
        if self._tokens is None:
            self._tokens = np.asarray(self.prompt.ids, dtype=np.int64)
        return self._tokens

    @property
    def prefilling(self) -> bool:
        """Started reading its prompt and not finished: its cache holds ``position`` tokens."""
        return self.cache is not None and not self.decoding and not self.done

    def shared_with(self, other: _Job) -> int:
        """Leading prompt tokens the two requests have in common."""
        return common_prefix_length(self.tokens, other.tokens)


class EmbeddedEngineCore:
    """A served model shared by the HTTP app, the gateway (in process) and a trainer."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_queue: int = 64,
        max_active: int = 8,
        logprobs_mode: str = "raw",
        kv_cache_entries: int = 32,
        kv_cache_bytes: int = 2 << 30,
        prefill_chunk: int = 512,
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
        self.loaded = loaded
        self.max_queue = max_queue
        self.max_active = max(1, max_active)
        self.logprobs_mode = logprobs_mode
        self.prefill_chunk = max(1, prefill_chunk)
        config = loaded.module.config
        self._buffered = supports_buffer_cache(config)
        self.prefix_cache = PrefixCache(kv_cache_entries if self._buffered else 0, kv_cache_bytes)
        self._num_layers = int(config.get_text_config().num_hidden_layers)
        self._eos_ids = _eos_ids(loaded)
        self._policy_version = 0
        self._token_texts: dict[int, str] = {}
        self._tokenizer_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: deque[_Job] = deque()
        self._active: list[_Job] = []
        self._paused = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._mean_job_seconds = 1.0
        self._batch = self._new_batch()
        self._batch_jobs: list[_Job] = []
        self._decode_steps = 0
        self._decoded_rows = 0
        self._prefill = {
            "requests": 0,
            "prompt_tokens": 0,
            "computed_tokens": 0,
            "reused_tokens": 0,
            "reused_in_flight_tokens": 0,
            "held_rounds": 0,
        }

    @classmethod
    def from_source(
        cls, source: str = DEFAULT_MODEL, *, dtype: str = "float32", **options: Any
    ) -> EmbeddedEngineCore:
        return cls(load_model(source, dtype=dtype), **options)

    @property
    def module(self) -> Any:
        """The served ``torch.nn.Module``; change its weights only inside :meth:`weights_update`."""
        return self.loaded.module

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def max_model_len(self) -> int:
        return self.loaded.max_model_len

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @property
    def _sharing(self) -> bool:
        """Whether prompts may reuse each other's keys and values (``kv_cache_entries`` > 0)."""
        return self._buffered and self.prefix_cache.max_entries > 0

    def bump_policy_version(self) -> int:
        """Mark the weights as changed: later completions carry the new version."""
        with self._cond:
            self._policy_version += 1
            self.prefix_cache.clear()
            return self._policy_version

    @contextmanager
    def weights_update(self, *, bump: bool = True) -> Iterator[Any]:
        """Hold generation while the caller changes the weights of the yielded module.

        Blocks the calling thread until in-flight generations finish; queued requests wait
        and resume afterwards, so every completion comes from exactly one policy version.
        """
        with self._cond:
            self._paused += 1
            while self._active:
                self._cond.wait()
        try:
            yield self.module
        finally:
            with self._cond:
                self.prefix_cache.clear()
                if bump:
                    self._policy_version += 1
                self._paused -= 1
                self._cond.notify_all()

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
    ) -> RenderedPrompt:
        with self._tokenizer_lock:
            return render_prompt(
                self.tokenizer,
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                continue_final=continue_final,
            )

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        with self._tokenizer_lock:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        with self._tokenizer_lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def prepare(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        params: GenerationParams | None = None,
        *,
        tool_choice: Any = None,
        continue_final: bool = False,
        single_tool_call: bool = False,
    ) -> _Job:
        """Render and validate a request (raises :class:`InvalidRequest`) without queueing it.

        ``continue_final`` leaves the last (assistant) message open for the model to continue;
        ``single_tool_call`` keeps only the first parsed call (``parallel_tool_calls: false``,
        as vLLM does)."""
        prompt = self.render(messages, tools, continue_final=continue_final)
        job = self._job(prompt, params or GenerationParams(), bool(tools) and tool_choice != "none")
        job.single_tool_call = single_tool_call
        return job

    def prepare_ids(self, prompt_ids: list[int], params: GenerationParams | None = None) -> _Job:
        """A token prompt (the gateway rendered it): generated as given, no tool parsing."""
        vocab = len(self.tokenizer)
        if not prompt_ids or any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt_ids
        ):
            raise InvalidRequest(f"prompt must be a non-empty list of token ids in [0, {vocab})")
        return self._job(RenderedPrompt("", list(prompt_ids)), params or GenerationParams(), False)

    def _job(self, prompt: RenderedPrompt, params: GenerationParams, parse_tools: bool) -> _Job:
        room = self.max_model_len - len(prompt.ids)
        if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
            asked = params.max_tokens if params.max_tokens is not None else 1
            raise InvalidRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(prompt.ids) + asked} tokens ({len(prompt.ids)} in the "
                f"messages, {asked} in the completion). Please reduce the length of the "
                "messages or completion."
            )
        vocab = self.module.config.get_text_config().vocab_size
        if any(not 0 <= t < vocab for t in params.stop_token_ids):
            raise InvalidRequest(f"stop_token_ids must be token ids in [0, {vocab})")
        return _Job(
            prompt=prompt,
            params=params,
            max_tokens=params.max_tokens if params.max_tokens is not None else room,
            sampler=Sampler(params, self.logprobs_mode),
            parse_tools=parse_tools,
        )

    def submit(self, job: _Job) -> Future[GenerationResult]:
        """Queue a prepared request; its future resolves on the scheduler thread."""
        with self._cond:
            if self._closed:
                raise EngineUnavailable("the embedded engine is shut down")
            if len(self._pending) >= self.max_queue:
                raise RateLimited(
                    f"the embedded engine's queue is full ({self.max_queue} waiting)",
                    retry_after=self._retry_after(),
                )
            self._pending.append(job)
            self._ensure_thread()
            self._cond.notify_all()
        return job.future

    async def generate(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        params: GenerationParams | None = None,
        *,
        tool_choice: Any = None,
        continue_final: bool = False,
        single_tool_call: bool = False,
    ) -> GenerationResult:
        """Generate without blocking the event loop (rendering and model work run off it)."""
        job = await asyncio.to_thread(
            partial(
                self.prepare,
                tool_choice=tool_choice,
                continue_final=continue_final,
                single_tool_call=single_tool_call,
            ),
            messages,
            tools,
            params,
        )
        return await asyncio.wrap_future(self.submit(job))

    async def generate_ids(
        self, prompt_ids: list[int], params: GenerationParams | None = None
    ) -> GenerationResult:
        """Generate after exactly ``prompt_ids`` (vLLM's token prompt on /v1/completions)."""
        job = await asyncio.to_thread(self.prepare_ids, prompt_ids, params)
        return await asyncio.wrap_future(self.submit(job))

    def generate_sync(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        params: GenerationParams | None = None,
        *,
        tool_choice: Any = None,
    ) -> GenerationResult:
        """Blocking form of :meth:`generate`, for scripts and trainer threads."""
        return self.submit(self.prepare(messages, tools, params, tool_choice=tool_choice)).result()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            waiting, active = len(self._pending), len(self._active)
        cache = self.prefix_cache
        return {
            "model": self.model_name,
            "policy_version": self._policy_version,
            "waiting": waiting,
            "active": active,
            "paused": self._paused > 0,
            "batched_decode": {"steps": self._decode_steps, "rows": self._decoded_rows},
            "prefill": dict(self._prefill),
            "prefix_cache": {
                "entries": len(cache),
                "bytes": cache.nbytes,
                "hits": cache.hits,
                "misses": cache.misses,
                "reused_tokens": cache.reused_tokens,
            },
        }

    def close(self) -> None:
        """Stop the scheduler; queued and in-flight requests fail with 503."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- scheduler thread -------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run_scheduler, name="polar-embedded-engine", daemon=True
            )
            self._thread.start()

    def _run_scheduler(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while (
                        not self._closed
                        and not self._active
                        and (self._paused or not self._pending)
                    ):
                        self._cond.wait()
                    if self._closed:
                        break
                    while (
                        not self._paused and self._pending and len(self._active) < self.max_active
                    ):
                        self._active.append(self._pending.popleft())
                    jobs = list(self._active)
                self._run_round(jobs)
                finished = [job for job in jobs if job.done]
                self._leave_batch(finished)
                with self._cond:
                    for job in finished:
                        self._active.remove(job)
                        # Settled only once inactive: a caller holding the result may at once
                        # start a weights update, which waits for no active generation.
                        _settle(job.future, job.outcome)
                    if not self._active:
                        self._cond.notify_all()
        self._fail_all(EngineUnavailable("the embedded engine is shut down"))

    def _fail_all(self, error: Exception) -> None:
        with self._cond:
            jobs = [*self._active, *self._pending]
            self._active.clear()
            self._pending.clear()
        for job in jobs:
            _settle(job.future, error)

    def _run_round(self, jobs: list[_Job]) -> None:
        """One prefill chunk for every job still reading its prompt (but those waiting for a
        shared prefix), then one decode step for every job generating (all batched rows in a
        single forward pass)."""
        for job in jobs:
            if job.future.cancelled():
                job.done = True
            elif job.cache is None and not job.decoding and self._waits(job, jobs):
                self._prefill["held_rounds"] += 1
            elif not job.decoding:
                try:
                    self._prefill_step(job, jobs)
                except Exception as exc:
                    job.fail(exc)
        decoding = [job for job in jobs if job.decoding and not job.done]
        batched = [job for job in decoding if job.first_row is not None]
        if batched:
            try:
                self._batched_decode_step(batched)
            except Exception as exc:
                for job in batched:
                    job.fail(exc)
        for job in decoding:
            if job.first_row is None:
                try:
                    self._sample(job, self._forward(job.last_tokens[:, None], job.cache))
                except Exception as exc:
                    job.fail(exc)

    def _waits(self, job: _Job, jobs: list[_Job]) -> bool:
        """Whether ``job`` should not start yet: another job is reading a prompt that shares a
        longer prefix with it than any cache holds, is not yet past that prefix, and waiting
        for it saves most of this job's prefill. Asked at the job's turn in the round, so jobs
        earlier in the round have read their chunk; of a group arriving together, the first
        starts and the others wait for it."""
        if not self._sharing:
            return False
        version = self._policy_version
        limit = len(job.prompt.ids) - 1
        cached = self.prefix_cache.match_length(job.prompt.ids, version, limit)
        ready = later = cached
        for reader in jobs:
            if reader is job or not reader.prefilling or reader.version != version:
                continue
            shared = min(job.shared_with(reader), limit)
            ready = max(ready, min(shared, reader.position))
            later = max(later, shared)
        gain = later - cached
        worth = gain >= SHARE_MIN_TOKENS and 2 * gain >= len(job.prompt.ids) - cached
        return worth and ready < later

    def _prefill_step(self, job: _Job, jobs: list[_Job]) -> None:
        prompt = job.prompt.ids
        if job.cache is None:
            job.started = time.perf_counter()
            job.version = self._policy_version
            job.cache, job.reused = self._start_cache(job, jobs)
            job.position = job.reused
            self._prefill["requests"] += 1
            self._prefill["prompt_tokens"] += len(prompt)
            self._prefill["reused_tokens"] += job.reused
        chunk = prompt[job.position : job.position + self.prefill_chunk]
        logits = self._forward(torch.tensor([chunk]), job.cache)
        job.position += len(chunk)
        self._prefill["computed_tokens"] += len(chunk)
        if job.position < len(prompt):
            return
        job.prefilled = time.perf_counter()
        n = job.params.n
        job.rows = [_Row() for _ in range(n)]
        self._sample(job, logits.expand(n, -1))
        if job.done or not self._buffered:
            if not job.done and n > 1:
                job.cache.batch_repeat_interleave(n)
            job.decoding = True
            return
        prefix = job.cache.prefix(len(prompt))
        # Stored now, not only when the generation ends, so that concurrent requests with the
        # same beginning reuse it (a finished generation's longer entry replaces it).
        self.prefix_cache.store(prompt, prefix, job.version)
        room = min(job.max_tokens, INITIAL_DECODE_ROOM)
        job.first_row = self._batch.add(prefix, copies=n, room=room)
        self._batch_jobs.append(job)
        job.cache = None
        job.decoding = True

    def _batched_decode_step(self, jobs: list[_Job]) -> None:
        batch = self._batch
        batch.ensure_room(1)
        # Rows of a request cancelled this round are still present until the round ends.
        input_ids = torch.zeros((batch.rows, 1), dtype=torch.long)
        for job in jobs:
            input_ids[job.rows_slice(), 0] = job.last_tokens
        position_ids, mask = batch.step_inputs()
        out = self.module(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            past_key_values=batch,
            use_cache=True,
            logits_to_keep=1,
        )
        batch.advance()
        self._decode_steps += 1
        self._decoded_rows += batch.rows
        logits = out.logits[:, -1]
        for job in jobs:
            self._sample(job, logits[job.rows_slice()])

    def _sample(self, job: _Job, logits: torch.Tensor) -> None:
        """Pick each row's next token; finish the job when every row has stopped."""
        out = job.sampler.step(logits)
        for i, row in enumerate(job.rows):
            if row.finish_reason is None:
                self._append(row, out, i, job)
        job.last_tokens = out.token_ids
        job.sampled += 1
        if all(row.finish_reason for row in job.rows) or job.sampled == job.max_tokens:
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        for row in job.rows:
            row.finish_reason = row.finish_reason or "length"
        if self._buffered and job.params.n == 1:
            # Keys and values exist for the prompt and every sampled token but the last.
            kept = job.prompt.ids + job.rows[0].token_ids[:-1]
            if job.first_row is not None:
                prefix = self._batch.prefix(job.first_row, len(kept))
            else:
                prefix = job.cache.prefix(len(kept))
            self.prefix_cache.store(kept, prefix, job.version)
        finished = time.perf_counter()
        result = self._result(job, job.rows, job.version)
        result.timing = {
            "queue_seconds": job.started - job.submitted,
            "prefill_seconds": job.prefilled - job.started,
            "decode_seconds": finished - job.prefilled,
            "prompt_tokens": len(job.prompt.ids),
            "reused_prefix_tokens": job.reused,
        }
        self._mean_job_seconds = 0.8 * self._mean_job_seconds + 0.2 * (finished - job.started)
        job.outcome = result
        job.done = True

    def _leave_batch(self, finished: list[_Job]) -> None:
        """Drop finished jobs' rows from the decode batch; the others move up."""
        if not any(job.first_row is not None for job in finished):
            return
        if any(job.failed and job.first_row is not None for job in finished):
            # A failed step leaves the batch in an unknown state: start a new one.
            for job in self._batch_jobs:
                if not job.done:
                    job.fail(EngineUnavailable("the decode batch failed; retry"))
                job.first_row = None
            self._batch = self._new_batch()
            self._batch_jobs = []
            return
        keep: list[int] = []
        remaining = []
        for job in self._batch_jobs:
            if job.done:
                continue
            rows = list(range(job.first_row or 0, (job.first_row or 0) + job.params.n))
            job.first_row = len(keep)
            keep.extend(rows)
            remaining.append(job)
        self._batch.keep(keep)
        self._batch_jobs = remaining

    def _new_batch(self) -> BatchCache:
        config = self.module.config.get_text_config()
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return BatchCache(self._num_layers, heads, head_dim, self.module.dtype)

    def _start_cache(self, job: _Job, jobs: list[_Job]) -> tuple[Any, int]:
        """A cache holding the longest reusable prefix of the job's prompt, from the prefix
        cache or from another job's prefill in progress (at least one token is left to run,
        since its logits start the generation)."""
        prompt = job.prompt.ids
        if not self._buffered:
            from transformers import DynamicCache

            return DynamicCache(config=self.module.config), 0
        cache = BufferCache(self._num_layers, len(prompt))
        limit = len(prompt) - 1
        donor, length = None, 0
        for other in jobs if self._sharing else ():
            if other is not job and other.prefilling and other.version == job.version:
                shared = min(job.shared_with(other), other.position, limit)
                if shared > length:
                    donor, length = other, shared
        if donor is not None and length > self.prefix_cache.match_length(
            prompt, job.version, limit
        ):
            copy_prefix(cache, donor.cache.prefix(length), length)
            self._prefill["reused_in_flight_tokens"] += length
            return cache, length
        match = self.prefix_cache.lookup(prompt, job.version, limit=limit)
        if match is None:
            return cache, 0
        load_prefix(cache, match)
        return cache, match.length

    def _forward(self, input_ids: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.module(
            input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1]

    def _append(self, row: _Row, out: StepOutput, i: int, job: _Job) -> None:
        token = int(out.token_ids[i])
        row.token_ids.append(token)
        row.logprobs.append(float(out.logprobs[i]))
        if out.top_ids is not None and out.top_logprobs is not None:
            row.top.append(
                list(zip(out.top_ids[i].tolist(), out.top_logprobs[i].tolist(), strict=True))
            )
        params = job.params
        if token in params.stop_token_ids:
            row.finish_reason, row.stop_reason = "stop", token
        elif (token in self._eos_ids and not params.ignore_eos) or (
            params.stop and self._tail_has_stop(row.token_ids, params.stop)
        ):
            row.finish_reason = "stop"

    def _tail_has_stop(self, ids: list[int], stops: tuple[str, ...]) -> bool:
        # A stop string ends in the newest token and spans at most a few tokens per character.
        window = 4 * max(len(s) for s in stops) + 2
        tail = self.decode(ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stops)

    def _result(self, job: _Job, rows: list[_Row], version: int) -> GenerationResult:
        choices = [self._choice(i, row, job) for i, row in enumerate(rows)]
        sampling = job.sampler.record()
        sampling["max_tokens"] = job.max_tokens
        return GenerationResult(
            id="chatcmpl-" + uuid.uuid4().hex,
            model=self.model_name,
            created=int(time.time()),
            prompt_ids=list(job.prompt.ids),
            choices=choices,
            policy_version=version,
            sampling=sampling,
            timing={},
        )

    def _choice(self, index: int, row: _Row, job: _Job) -> ChoiceResult:
        ids = row.token_ids
        text_ids = (
            ids[:-1]
            if row.finish_reason == "stop"
            and ids
            and (ids[-1] in self._eos_ids or ids[-1] in job.params.stop_token_ids)
            else ids
        )
        text = self.decode(text_ids, skip_special_tokens=True)
        text, stop_string = cut_at_stop(text, job.params.stop)
        if stop_string is not None:
            row.stop_reason = stop_string
        content, tool_calls = parse_tool_calls(text) if job.parse_tools else (text, [])
        if job.single_tool_call:
            tool_calls = tool_calls[:1]
        finish = "tool_calls" if tool_calls else row.finish_reason or "stop"
        top = None
        if job.params.top_logprobs:
            top = [[(t, self._token_text(t), lp) for t, lp in step] for step in row.top]
        return ChoiceResult(
            index=index,
            token_ids=list(ids),
            logprobs=list(row.logprobs),
            token_texts=[self._token_text(t) for t in ids],
            top_logprobs=top,
            text=text,
            content=content,
            tool_calls=tool_calls,
            finish_reason=finish,
            stop_reason=row.stop_reason,
        )

    def _token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.decode([token_id])
        return text

    def _retry_after(self) -> float:
        waiting_rounds = (len(self._pending) + len(self._active)) / self.max_active
        return float(min(60, max(1, math.ceil(waiting_rounds * self._mean_job_seconds))))


def _settle(future: Future[GenerationResult], outcome: GenerationResult | Exception | None) -> None:
    """Resolve ``future`` unless its caller already gave up on it (or it was cancelled)."""
    if outcome is None:
        return
    try:
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass


def _eos_ids(loaded: LoadedModel) -> frozenset[int]:
    """Ids that end a turn: the tokenizer's eos and the generation config's eos ids."""
    ids: set[int] = set()
    if loaded.tokenizer.eos_token_id is not None:
        ids.add(int(loaded.tokenizer.eos_token_id))
    configured = getattr(getattr(loaded.module, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(t) for t in configured)
    return frozenset(ids)
