"""Captured sessions for builder tests: hand-made records, and agents rendered by a real template.

:class:`Agent` plays a harness talking to an engine whose prompts come from a real tokenizer's
chat template (``apply_chat_template(..., add_generation_prompt=True)``), with tool calls and
results rendered as text the way engines serving tool-less templates do
(:func:`polar.rendering.tool_text.messages_for_plain_template`). Its sampled ids are the reply
text's tokens plus the end-of-turn token, exactly as an engine returns them.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from polar.capture.records import CaptureRecord
from polar.rendering.tool_text import assistant_text, messages_for_plain_template

EOT = 2  # SmolLM2's <|im_end|>
QWEN3_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]

_ids = itertools.count()


def record(
    prompt: list[int],
    sampled: list[int],
    *,
    seq: int | None = None,
    logprobs: list[float] | str | None = "auto",
    finish: str = "stop",
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
    response: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    flags: list[str] | None = None,
    policy_version: int | None = None,
    completion_id: str | None = None,
) -> CaptureRecord:
    """One captured call; logprobs default to a distinct value per sampled token."""
    n = next(_ids)
    if logprobs == "auto":
        logprobs = [-(n + 1) / 1000 - i / 10 for i in range(len(sampled))]
    body: dict[str, Any] = {"model": "m", "messages": messages or []}
    if tools:
        body["tools"] = tools
    return CaptureRecord(
        completion_id=completion_id or f"cmpl-{n}",
        session_id="sess",
        seq=n if seq is None else seq,
        provider="openai_chat",
        model="m",
        engine="scripted",
        policy_version=policy_version,
        started_at=float(n),
        finished_at=float(n) + 0.5,
        upstream_request=body,
        response=response or {"role": "assistant", "content": f"reply {n}"},
        prompt_ids=prompt,
        sampled_ids=sampled,
        logprobs=logprobs if not isinstance(logprobs, str) else None,
        finish_reason=finish,
        tags=tags or [],
        flags=flags or [],
    )


class Agent:
    """A harness conversation rendered by a real chat template; ``call`` captures one turn."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        system: str | None = "You are a careful coding agent.",
        task: str = "Fix the failing test.",
        tools: list[dict[str, Any]] | None = None,
        eot: int = EOT,
        plain_tools: bool = True,
        **template_kwargs: Any,
    ) -> None:
        self.tok = tokenizer
        self.plain_tools = plain_tools
        self.tools = tools
        self.eot = eot
        self.template_kwargs = template_kwargs
        self.messages: list[dict[str, Any]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})
        self.messages.append({"role": "user", "content": task})
        self.records: list[CaptureRecord] = []

    def prompt_ids(self) -> list[int]:
        if self.plain_tools:
            rendered = messages_for_plain_template(self.messages, self.tools)
            tools = None
        else:
            rendered, tools = self.messages, self.tools
        return list(
            self.tok.apply_chat_template(
                rendered,
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **self.template_kwargs,
            )
        )

    def call(
        self,
        content: str,
        *,
        tool_cmd: str | None = None,
        sampled_prefix: str = "",
        max_tokens: int | None = None,
        history: dict[str, Any] | None = None,
        split_text: bool = False,
        **record_kwargs: Any,
    ) -> CaptureRecord:
        """The engine samples ``sampled_prefix + content`` (+ a tool call); returns the capture.

        ``max_tokens`` cuts the sample short (a length stop); ``history`` overrides the
        assistant message the harness puts back (e.g. reasoning carried separately);
        ``split_text`` samples the text as two separately tokenized halves, a non-canonical
        tokenization that the template's re-rendering will not reproduce (drift).
        """
        calls = []
        if tool_cmd is not None:
            calls = [
                {
                    "id": f"call_{len(self.records)}",
                    "type": "function",
                    "function": {"name": "run", "arguments": f'{{"cmd": "{tool_cmd}"}}'},
                }
            ]
        text = sampled_prefix + assistant_text(content, calls)
        pieces = [text[: len(text) // 2], text[len(text) // 2 :]] if split_text else [text]
        sampled = [t for p in pieces for t in self.tok.encode(p, add_special_tokens=False)]
        sampled.append(self.eot)
        finish = "tool_calls" if calls else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        if max_tokens is not None and max_tokens < len(sampled):
            sampled = sampled[:max_tokens]
            finish = "length"
            message = {"role": "assistant", "content": self.tok.decode(sampled)}
        rec = record(
            self.prompt_ids(),
            sampled,
            finish=finish,
            messages=list(self.messages),
            tools=self.tools,
            response=message,
            **record_kwargs,
        )
        self.messages.append(history or message)
        self.records.append(rec)
        return rec

    def tool_result(self, text: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": "x", "content": text})

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
