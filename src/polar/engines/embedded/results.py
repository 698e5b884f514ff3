"""From sampled ids to what a caller reads: stop checks, text, tool calls, token texts.

Apart from the scheduler because none of it touches the model: it needs only the tokenizer
(through the core's locked ``decode``) and the ids that end a turn.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polar.engines.embedded.loader import LoadedModel
from polar.engines.embedded.sampling import GenerationParams, StepOutput
from polar.rendering.renderer import cut_at_stop
from polar.rendering.tool_text import parse_tool_calls

if TYPE_CHECKING:
    from polar.engines.embedded.job import Job, Row


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


class ResultWriter:
    """Appends sampled tokens to rows (deciding where each stops) and writes the result."""

    def __init__(
        self, decode: Callable[..., str], eos_ids: frozenset[int], model_name: str
    ) -> None:
        self._decode = decode
        self.eos_ids = eos_ids
        self.model_name = model_name
        self._token_texts: dict[int, str] = {}

    def append(self, row: Row, out: StepOutput, i: int, params: GenerationParams) -> None:
        """Add row ``i``'s sampled token; mark the row stopped by a stop id, eos or string."""
        token = int(out.token_ids[i])
        row.token_ids.append(token)
        row.logprobs.append(float(out.logprobs[i]))
        if out.top_ids is not None and out.top_logprobs is not None:
            row.top.append(
                list(zip(out.top_ids[i].tolist(), out.top_logprobs[i].tolist(), strict=True))
            )
        if token in params.stop_token_ids:
            row.finish_reason, row.stop_reason = "stop", token
        elif (token in self.eos_ids and not params.ignore_eos) or (
            params.stop and self._tail_has_stop(row.token_ids, params.stop)
        ):
            row.finish_reason = "stop"

    def _tail_has_stop(self, ids: list[int], stops: tuple[str, ...]) -> bool:
        # A stop string ends in the newest token and spans at most a few tokens per character.
        window = 4 * max(len(s) for s in stops) + 2
        tail = self._decode(ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stops)

    def result(self, job: Job, version: int) -> GenerationResult:
        choices = [self._choice(i, row, job) for i, row in enumerate(job.rows)]
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

    def _choice(self, index: int, row: Row, job: Job) -> ChoiceResult:
        ids = row.token_ids
        text_ids = (
            ids[:-1]
            if row.finish_reason == "stop"
            and ids
            and (ids[-1] in self.eos_ids or ids[-1] in job.params.stop_token_ids)
            else ids
        )
        text = self._decode(text_ids, skip_special_tokens=True)
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
            text = self._token_texts[token_id] = self._decode([token_id])
        return text


def eos_ids(loaded: LoadedModel) -> frozenset[int]:
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
