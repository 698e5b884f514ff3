"""The embedded engine's scheduler: one thread runs all model work, in fair batched rounds.

All model work runs on one scheduler thread, so the server's event loop never blocks and the
trainer can share the very module being served. Requests wait in a bounded FIFO queue; up to
``max_active`` of them are in flight at once. Each scheduler round runs one prefill chunk for
every request still reading its prompt, then one decode step for every request generating, all
rows in one batched forward pass (a CPU decode step costs about the same for several rows as for
one), so concurrent sessions share the model and a long generation does not starve a short one.
A full queue refuses new work with :class:`RateLimited` and a Retry-After estimate instead of
growing without bound.

A request's prompt is read straight into its rows of the decode batch, which then join the
decoding rows where they are: its keys and values are held once, besides (at most) its entry in
the bounded prefix cache, not also in a prefill cache of their own.

Concurrent prompts that begin alike (a GRPO group, a batch of sessions of one harness) share
their prefill: every prompt's keys and values go into the prefix cache as soon as it is read,
a new request starts from the longest prefix that the cache or another request's ongoing
prefill holds, and a request whose prompt mostly repeats one still being read waits for it
instead of computing the same positions again.

:meth:`Scheduler.weights_update` waits for in-flight generations to finish, holds new ones
back, and on exit drops every cached prefix (their keys and values belong to the old weights).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import torch

from polar.engines.embedded.job import Job, Row, settle
from polar.engines.embedded.kv_cache import (
    BatchCache,
    PrefixCache,
    cache_keyword,
    supports_batch_cache,
)
from polar.engines.embedded.loader import LoadedModel
from polar.engines.embedded.results import GenerationResult, ResultWriter
from polar.errors import EngineUnavailable, RateLimited

# Decode rows start with room for this many new tokens and grow when a generation needs more.
INITIAL_DECODE_ROOM = 256
# A request waits for another's prefill only to skip at least this many prompt tokens, and at
# least half of what it would otherwise compute.
SHARE_MIN_TOKENS = 32


class Scheduler:
    """The queue, the scheduler thread and the decode batch of one served model."""

    def __init__(
        self,
        loaded: LoadedModel,
        writer: ResultWriter,
        *,
        max_queue: int,
        max_active: int,
        kv_cache_entries: int,
        kv_cache_bytes: int,
        prefill_chunk: int,
    ) -> None:
        self.loaded = loaded
        self._text = writer
        self.max_queue = max_queue
        self.max_active = max(1, max_active)
        self.prefill_chunk = max(1, prefill_chunk)
        config = loaded.module.config
        self._buffered = supports_batch_cache(config)
        self.prefix_cache = PrefixCache(kv_cache_entries if self._buffered else 0, kv_cache_bytes)
        self._num_layers = int(config.get_text_config().num_hidden_layers)
        self._cache_keyword = cache_keyword(loaded.module)
        self._policy_version = 0
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._active: list[Job] = []
        self._paused = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._mean_job_seconds = 1.0
        self._batch = self._new_batch()
        # The jobs whose rows the batch holds, in row order: decoding ones, then reading ones.
        self._decode_jobs: list[Job] = []
        self._reading_jobs: list[Job] = []
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

    @property
    def module(self) -> Any:
        """The served ``torch.nn.Module``; change its weights only inside :meth:`weights_update`."""
        return self.loaded.module

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
        and resume afterwards, so every completion comes from exactly one policy version. The
        prefix cache is emptied once they have: its entries are stale as soon as the weights
        change, and freeing them first lets the caller's update reuse that memory.
        """
        with self._cond:
            self._paused += 1
            while self._active:
                self._cond.wait()
            self.prefix_cache.clear()
        try:
            yield self.module
        finally:
            with self._cond:
                if bump:
                    self._policy_version += 1
                self._paused -= 1
                self._cond.notify_all()

    def submit(self, job: Job) -> Future[GenerationResult]:
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

    def stats(self) -> dict[str, Any]:
        with self._cond:
            waiting, active = len(self._pending), len(self._active)
        cache = self.prefix_cache
        return {
            "model": self.loaded.name,
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
                        settle(job.future, job.outcome)
                    if not self._active:
                        self._cond.notify_all()
        self._fail_all(EngineUnavailable("the embedded engine is shut down"))

    def _fail_all(self, error: Exception) -> None:
        with self._cond:
            jobs = [*self._active, *self._pending]
            self._active.clear()
            self._pending.clear()
        for job in jobs:
            settle(job.future, error)

    def _run_round(self, jobs: list[Job]) -> None:
        """One prefill chunk for every job still reading its prompt (but those waiting for a
        shared prefix), then one decode step for every job generating (all batched rows in a
        single forward pass)."""
        for job in jobs:
            if job.future.cancelled():
                job.done = True
            elif not job.begun and self._waits(job, jobs):
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

    def _waits(self, job: Job, jobs: list[Job]) -> bool:
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

    def _prefill_step(self, job: Job, jobs: list[Job]) -> None:
        prompt = job.prompt.ids
        if not job.begun:
            job.begun = True
            job.started = time.perf_counter()
            job.version = self._policy_version
            job.reused = self._start(job, jobs)
            job.position = job.reused
            self._prefill["requests"] += 1
            self._prefill["prompt_tokens"] += len(prompt)
            self._prefill["reused_tokens"] += job.reused
        chunk = prompt[job.position : job.position + self.prefill_chunk]
        if job.first_row is None:
            logits = self._forward(torch.tensor([chunk]), job.cache)
        else:
            logits = self._forward(torch.tensor([chunk]), self._batch.row_cache(job.first_row))
            self._batch.extend(job.first_row, len(chunk))
        job.position += len(chunk)
        self._prefill["computed_tokens"] += len(chunk)
        if job.position < len(prompt):
            return
        job.prefilled = time.perf_counter()
        n = job.params.n
        job.rows = [Row() for _ in range(n)]
        self._sample(job, logits.expand(n, -1))
        job.decoding = True
        if job.done:
            return
        if job.first_row is None:
            if n > 1:
                job.cache.batch_repeat_interleave(n)
            return
        # Stored now, not only when the generation ends, so that concurrent requests with the
        # same beginning reuse it (a finished generation's longer entry replaces it).
        self.prefix_cache.store(prompt, self._batch.prefix(job.first_row, len(prompt)), job.version)
        self._batch.fan_out(job.first_row, n)
        self._reading_jobs.remove(job)
        self._decode_jobs.append(job)
        self._arrange()

    def _batched_decode_step(self, jobs: list[Job]) -> None:
        batch = self._batch
        batch.ensure_room(1)
        # Rows of a request cancelled this round are still present until the round ends.
        input_ids = torch.zeros((batch.decoding, 1), dtype=torch.long)
        for job in jobs:
            input_ids[job.rows_slice(), 0] = job.last_tokens
        position_ids, mask = batch.step_inputs()
        out = self.module(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_keyword: batch},
        )
        batch.advance()
        self._decode_steps += 1
        self._decoded_rows += batch.decoding
        logits = out.logits[:, -1]
        for job in jobs:
            self._sample(job, logits[job.rows_slice()])

    def _sample(self, job: Job, logits: torch.Tensor) -> None:
        """Pick each row's next token; finish the job when every row has stopped."""
        out = job.sampler.step(logits)
        for i, row in enumerate(job.rows):
            if row.finish_reason is None:
                self._text.append(row, out, i, job.params)
        job.last_tokens = out.token_ids
        job.sampled += 1
        if all(row.finish_reason for row in job.rows) or job.sampled == job.max_tokens:
            self._finish(job)

    def _finish(self, job: Job) -> None:
        for row in job.rows:
            row.finish_reason = row.finish_reason or "length"
        if self._buffered and job.params.n == 1:
            # Keys and values exist for the prompt and every sampled token but the last.
            kept = job.prompt.ids + job.rows[0].token_ids[:-1]
            first = job.first_row or 0  # a batched model's job always has rows
            self.prefix_cache.store(kept, self._batch.prefix(first, len(kept)), job.version)
        finished = time.perf_counter()
        result = self._text.result(job, job.version)
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

    def _leave_batch(self, finished: list[Job]) -> None:
        """Drop finished (or failed, or cancelled) jobs' rows from the batch; the others move up.

        A failure touches no other job's rows: a prefill writes only its own row, and a decode
        step only the positions past each decoding row's length (all of whose jobs then fail).
        """
        if not any(job.first_row is not None for job in finished):
            return
        self._decode_jobs = [job for job in self._decode_jobs if not job.done]
        self._reading_jobs = [job for job in self._reading_jobs if not job.done]
        self._arrange()

    def _arrange(self) -> None:
        """Lay the batch out as the job lists say (decoding rows first) and renumber them."""
        rows: list[int] = []
        for job in (*self._decode_jobs, *self._reading_jobs):
            first = job.first_row or 0
            job.first_row = len(rows)
            rows.extend(range(first, first + job.params.n))
        self._batch.arrange(rows, sum(job.params.n for job in self._decode_jobs))

    def _new_batch(self) -> BatchCache:
        config = self.module.config.get_text_config()
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return BatchCache(self._num_layers, heads, head_dim, self.module.dtype)

    def _start(self, job: Job, jobs: list[Job]) -> int:
        """Give the job somewhere to prefill into, holding the longest reusable prefix of its
        prompt (from the prefix cache, or from another job's prefill in progress; at least one
        token is left to run, since its logits start the generation); returns that length.

        A batched model's job gets its rows in the batch, with room for the prompt and its first
        decode positions, and is prefilled straight into the first of them."""
        prompt = job.prompt.ids
        if not self._buffered:
            from transformers import DynamicCache

            job.cache = DynamicCache(config=self.module.config)
            return 0
        room = min(job.max_tokens, INITIAL_DECODE_ROOM)
        job.first_row = self._batch.reserve(job.params.n, len(prompt) + room)
        self._reading_jobs.append(job)
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
            donated = self._batch.prefix(donor.first_row or 0, length)
            self._batch.load(job.first_row, donated, length)
            self._prefill["reused_in_flight_tokens"] += length
            return length
        match = self.prefix_cache.lookup(prompt, job.version, limit=limit)
        if match is None:
            return 0
        self._batch.load(job.first_row, match.entry.layers, match.length)
        return match.length

    def _forward(self, input_ids: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.module(
            input_ids=input_ids, use_cache=True, logits_to_keep=1, **{self._cache_keyword: cache}
        )
        return out.logits[:, -1]

    def _retry_after(self) -> float:
        waiting_rounds = (len(self._pending) + len(self._active)) / self.max_active
        return float(min(60, max(1, math.ceil(waiting_rounds * self._mean_job_seconds))))
