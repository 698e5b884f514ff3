"""A session's trajectory as HTML, turn by turn: what the quickstart report and the rollout
server's dashboard both show.

The tokens the engine sampled (trainable, loss mask 1) are highlighted, each with its logprob;
the tokens between turns (tool results, template glue; mask 0) are greyed. Token text comes from
the served model's tokenizer; without one, ids are shown as numbers, and the trace's messages
(which every trace carries) say in words what was said.

This module only turns results into plain view data; the markup lives in the Jinja macros of
``templates/trajectory.html.jinja`` and the style in ``templates/trajectory.css.jinja``, which a
page includes through :func:`environment` (autoescaped, so token text and tool output stay text).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from jinja2 import BaseLoader, ChoiceLoader, Environment, PackageLoader, StrictUndefined

from polar.schemas.task import SessionResult
from polar.schemas.trajectory import Trace

# Tokens the model found unlikely (logprob below this) are marked, to make surprises visible.
SURPRISE_LOGPROB = -2.5
# A message's text is cut here: a page shows the conversation, not every byte of tool output.
MESSAGE_CHARS = 4000


def environment(*loaders: BaseLoader) -> Environment:
    """A Jinja environment over ``loaders`` that can also import this module's templates
    (``trajectory.html.jinja``'s ``session`` macro, ``trajectory.css.jinja``)."""
    env = Environment(
        loader=ChoiceLoader([*loaders, PackageLoader("polar.trajectory", "templates")]),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals.update(surprise_logprob=SURPRISE_LOGPROB)
    return env


class TokenText:
    """Token id to display text, cached; ``⟨id⟩`` without a tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self.tokenizer is None:
                text = f"⟨{token_id}⟩"
            else:
                text = str(self.tokenizer.decode([token_id]))
            self._cache[token_id] = text
        return text

    def join(self, ids: Iterable[int]) -> str:
        if self.tokenizer is None:
            return " ".join(self(i) for i in ids)
        return str(self.tokenizer.decode(list(ids)))


@dataclass(frozen=True)
class SampledToken:
    id: int
    text: str
    logprob: float | None


@dataclass(frozen=True)
class SampledTurn:
    sampled: ClassVar[bool] = True
    number: int
    tokens: list[SampledToken]
    mean_logprob: float | None


@dataclass(frozen=True)
class BetweenTurns:
    sampled: ClassVar[bool] = False
    size: int
    text: str


@dataclass(frozen=True)
class MessageView:
    role: str
    text: str


@dataclass(frozen=True)
class TraceView:
    index: int
    calls: object
    prompt_size: int
    response_size: int
    trainable: int
    finish_reason: str | None
    break_reason: object
    lineage: str | None  # e.g. "subagent of trace 0 (claude_code_subagent_prompt)"
    masked: str | None  # sampled tokens masked, by reason: "retry_abandoned 3"
    prompt_text: str
    turns: list[SampledTurn | BetweenTurns]
    messages: list[MessageView]


@dataclass(frozen=True)
class SessionView:
    anchor: str
    session_id: str
    task_id: str
    sample: object
    status: str
    reward: float | None
    calls: object
    drift: tuple[object, object] | None  # (turns, tokens), when the trajectory says
    breaks: object
    error: str | None
    traces: list[TraceView]


def session_view(r: SessionResult, decoder: TokenText) -> SessionView:
    """One finished session, every trace turn by turn."""
    trajectory = r.trajectory
    stats = trajectory.stats if trajectory else None
    return SessionView(
        anchor=anchor(r),
        session_id=r.session_id,
        task_id=r.task_id,
        sample="?" if r.sample_index is None else r.sample_index,
        status=r.status.value,
        reward=r.reward,
        calls=stats.num_calls if stats else 0,
        drift=(stats.drift_turns, stats.drift_tokens) if stats else None,
        breaks=stats.breaks if stats else None,
        error=r.error[:300] if r.error else None,
        traces=[
            trace_view(trace, index, decoder)
            for index, trace in enumerate(trajectory.traces if trajectory else [])
        ],
    )


def anchor(r: SessionResult) -> str:
    return f"s-{r.session_id}"


def trace_view(trace: Trace, index: int, decoder: TokenText) -> TraceView:
    turns: list[SampledTurn | BetweenTurns] = []
    sampled = 0
    for start, end, trainable in _runs(trace.loss_mask):
        ids = trace.response_ids[start:end]
        if trainable:
            sampled += 1
            logprobs = trace.response_logprobs[start:end] if trace.response_logprobs else None
            turns.append(_sampled_turn(sampled, ids, logprobs, decoder))
        else:
            turns.append(BetweenTurns(size=len(ids), text=decoder.join(ids)))
    return TraceView(
        index=index,
        calls=trace.stats.num_calls,
        prompt_size=len(trace.prompt_ids),
        response_size=len(trace.response_ids),
        trainable=sum(trace.loss_mask),
        finish_reason=trace.finish_reason,
        break_reason=trace.stats.break_reason,
        lineage=_lineage(trace),
        masked=_masked(trace),
        prompt_text=decoder.join(trace.prompt_ids),
        turns=turns,
        messages=[_message(m) for m in [*trace.prompt_messages, *trace.response_messages]],
    )


def _lineage(trace: Trace) -> str | None:
    line = trace.lineage
    if line is None:
        return None
    parent = f" of trace {line.parent_trace}" if line.parent_trace is not None else ""
    step = f" {line.compaction.step.value}" if line.compaction is not None else ""
    return f"{line.kind.value}{step}{parent} ({line.reason})"


def _masked(trace: Trace) -> str | None:
    tokens: Counter[str] = Counter()
    for span in trace.masked:
        tokens[span.reason.value] += span.end - span.start
    return ", ".join(f"{reason} {n}" for reason, n in sorted(tokens.items())) or None


def _sampled_turn(
    number: int, ids: list[int], logprobs: list[float] | None, decoder: TokenText
) -> SampledTurn:
    tokens = [
        SampledToken(token_id, decoder(token_id), logprobs[i] if logprobs is not None else None)
        for i, token_id in enumerate(ids)
    ]
    mean = sum(logprobs) / len(logprobs) if logprobs else None
    return SampledTurn(number=number, tokens=tokens, mean_logprob=mean)


def _runs(mask: list[int]) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal mask values as (start, end, trainable)."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, mask[start] == 1))
            start = i
    return runs


def _message(message: Mapping[str, Any]) -> MessageView:
    """A chat message as a role and plain text: its text parts, then its tool calls."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping):
                parts.append(f"[{part.get('type', 'part')}]")
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = orjson.dumps(arguments).decode()
        parts.append(f"→ {function.get('name', '?')}({arguments})")
    text = "\n".join(p for p in parts if p)
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS] + f" … ({len(text) - MESSAGE_CHARS} more characters)"
    return MessageView(role=str(message.get("role", "?")), text=text)
