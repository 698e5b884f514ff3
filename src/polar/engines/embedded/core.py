"""The embedded engine: one model, a fair scheduler thread, prefix reuse, on-policy weights.

:class:`EmbeddedEngineCore` is the front door: it renders and validates requests and hands
them to its :class:`~polar.engines.embedded.scheduler.Scheduler`, which runs all model work on
one thread (batched rounds, shared prefills). It is a scheduler rather than holding one so that
the trainer, the server and the gateway see one object with one lock.

Every completion records the policy version that produced it. :meth:`weights_update` lets a
trainer in the same process change the weights between generations: it waits for in-flight
generations to finish, holds new ones back, and on exit drops every cached prefix and bumps the
version.
"""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from typing import Any

from polar.engines.embedded.job import Job
from polar.engines.embedded.loader import DEFAULT_MODEL, LoadedModel, load_model
from polar.engines.embedded.results import (
    ChoiceResult,
    GenerationResult,
    ResultWriter,
    eos_ids,
)
from polar.engines.embedded.sampling import LOGPROBS_MODES, GenerationParams, Sampler
from polar.engines.embedded.scheduler import Scheduler
from polar.errors import ConfigError, InvalidRequest
from polar.rendering.chat_template import RenderedPrompt, render_prompt

__all__ = ["ChoiceResult", "EmbeddedEngineCore", "GenerationResult"]


class EmbeddedEngineCore(Scheduler):
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
        self.logprobs_mode = logprobs_mode
        self._tokenizer_lock = threading.Lock()
        super().__init__(
            loaded,
            ResultWriter(self.decode, eos_ids(loaded), loaded.name),
            max_queue=max_queue,
            max_active=max_active,
            kv_cache_entries=kv_cache_entries,
            kv_cache_bytes=kv_cache_bytes,
            prefill_chunk=prefill_chunk,
        )

    @classmethod
    def from_source(
        cls, source: str = DEFAULT_MODEL, *, dtype: str = "float32", **options: Any
    ) -> EmbeddedEngineCore:
        return cls(load_model(source, dtype=dtype), **options)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def max_model_len(self) -> int:
        return self.loaded.max_model_len

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
    ) -> Job:
        """Render and validate a request (raises :class:`InvalidRequest`) without queueing it.

        ``continue_final`` leaves the last (assistant) message open for the model to continue;
        ``single_tool_call`` keeps only the first parsed call (``parallel_tool_calls: false``,
        as vLLM does)."""
        prompt = self.render(messages, tools, continue_final=continue_final)
        job = self._job(prompt, params or GenerationParams(), bool(tools) and tool_choice != "none")
        job.single_tool_call = single_tool_call
        return job

    def prepare_ids(self, prompt_ids: list[int], params: GenerationParams | None = None) -> Job:
        """A token prompt (the gateway rendered it): generated as given, no tool parsing."""
        vocab = len(self.tokenizer)
        if not prompt_ids or any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt_ids
        ):
            raise InvalidRequest(f"prompt must be a non-empty list of token ids in [0, {vocab})")
        return self._job(RenderedPrompt("", list(prompt_ids)), params or GenerationParams(), False)

    def _job(self, prompt: RenderedPrompt, params: GenerationParams, parse_tools: bool) -> Job:
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
        return Job(
            prompt=prompt,
            params=params,
            max_tokens=params.max_tokens if params.max_tokens is not None else room,
            sampler=Sampler(params, self.logprobs_mode),
            parse_tools=parse_tools,
        )

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
