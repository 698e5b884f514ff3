"""The scripted engine's backend: chat and token-prompt bodies in, vLLM-shaped replies out.

Prompt ids come from a REAL tokenizer and chat template, and sampled ids from tokenizing the
reply exactly as a model would emit it, so capture and prefix merging downstream see the token
structure a real engine produces. It is as strict as vLLM: an unknown model name is a 404, a
prompt over the context window a 400 (an output budget that does not fit is lowered).

``noncanonical=True`` samples the way real models do and templates do not re-render: tool-call
JSON pretty-printed, and text in a tokenization that re-encoding does not reproduce. With
engine-side rendering the next prompt then differs from what was sampled (drift), exactly the
defect a canonical fake hides.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from polar.engines.scripted_checks import (
    chat_schema,
    check_regex,
    check_structured_output,
    check_tool_choice,
    token_regex,
    token_schema,
)
from polar.engines.scripted_script import Script, ScriptedReply
from polar.engines.types import usage_body
from polar.errors import EngineRefusal
from polar.rendering.model_files import load_tokenizer
from polar.rendering.parsers.think import split_think
from polar.rendering.tool_text import assistant_text, messages_for_plain_template
from polar.schemas.model_files import SMOLLM2_MODEL_NAME


def logprob_for(position: int, token_id: int) -> float:
    """A deterministic, token-dependent fake logprob (real values come from real engines)."""
    return -((token_id * 7 + position * 13) % 97) / 40.0 - 0.01


class ScriptedBackend:
    """Turns chat-completions bodies into vLLM-shaped replies following a :class:`Script`."""

    def __init__(
        self,
        script: Script | None = None,
        tokenizer: Any = None,
        model_name: str = SMOLLM2_MODEL_NAME,
        max_model_len: int = 8192,
        *,
        noncanonical: bool = False,
        multimodal: bool = False,
    ) -> None:
        self.script = script or Script()
        # A text-only model refuses image parts as vLLM does; a multimodal one takes them.
        self.multimodal = multimodal
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.noncanonical = noncanonical
        self.eot_id = int(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.log: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []  # every body it received, as received

    def prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        rendered = messages_for_plain_template([_image_tokens(m) for m in messages], tools)
        ids = self.tokenizer.apply_chat_template(
            rendered,
            add_generation_prompt=not continue_final,
            continue_final_message=continue_final,
            tokenize=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def conversation(self, body: dict[str, Any]) -> tuple[str, int]:
        """A request's conversation as text, and the assistant turns it already holds."""
        messages = body.get("messages")
        if isinstance(messages, list):
            text = "\n".join(_message_text(m) for m in messages if isinstance(m, dict))
            turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
            return text, turns
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return "", 0
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        # The rendered prompt ends with the generation prompt: one assistant header more than
        # the turns already taken.
        return text, max(text.count("<|im_start|>assistant") - 1, 0)

    def check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise EngineRefusal(404, f"The model `{model}` does not exist.")

    def room(self, prompt: list[int], body: dict[str, Any]) -> int:
        """The output budget vLLM would grant, or a refusal in its words."""
        if len(prompt) >= self.max_model_len:
            raise EngineRefusal(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {len(prompt)} input tokens. Please reduce the length of the "
                "input messages.",
            )
        asked = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(asked, int) and asked > self.max_model_len:
            raise EngineRefusal(
                400,
                f"max_tokens={asked} cannot be greater than max_model_len={self.max_model_len}.",
            )
        room = self.max_model_len - len(prompt)
        return min(asked, room) if isinstance(asked, int) else room

    def sample(
        self, reply: ScriptedReply, max_tokens: int, stops: list[str] | None = None
    ) -> tuple[list[int], str, list, str | None]:
        """The ids a model emits for ``reply``, the finish reason, the structured calls, and
        the stop string that ended it (vLLM stops there; the ids run through the stop)."""
        calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for name, args in reply.tool_calls
        ]
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        if self.noncanonical:
            rendered = [
                "<tool_call>\n"
                + json.dumps({"name": n, "arguments": a}, ensure_ascii=False, indent=4)
                + "\n</tool_call>"
                for n, a in reply.tool_calls
            ]
            text = "\n".join([reply.content, *rendered] if reply.content else rendered)
        else:
            text = assistant_text(reply.content, calls)
        if reply.reasoning:
            text = f"<think>\n{reply.reasoning}\n</think>\n" + text
        hits = sorted((text.find(s), s) for s in stops or [] if s and s in text)
        stop = hits[0][1] if hits else None
        if stop is not None:
            text, calls, finish = text[: hits[0][0] + len(stop)], [], "stop"
        sampled = self._encode(text)
        if len(sampled) >= max_tokens:
            sampled, finish, stop = sampled[:max_tokens], "length", None
        elif finish != "length" and stop is None:
            sampled.append(self.eot_id)
        return sampled, finish, calls, stop

    def _encode(self, text: str) -> list[int]:
        if not self.noncanonical or len(text) < 2:
            return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]
        # Two halves tokenized apart: the same text, ids that re-encoding does not give back.
        half = len(text) // 2
        return [
            int(t)
            for piece in (text[:half], text[half:])
            for t in self.tokenizer.encode(piece, add_special_tokens=False)
        ]

    def logprob_entries(self, sampled: list[int]) -> list[dict[str, Any]]:
        return [
            {
                "token": self.tokenizer.convert_ids_to_tokens(t),
                "logprob": logprob_for(i, t),
                "bytes": None,
                "top_logprobs": [],
            }
            for i, t in enumerate(sampled)
        ]

    def run_to_stop(
        self,
        sampled: list[int],
        finish: str,
        stop: str | int | None,
        body: dict[str, Any],
        room: int,
    ) -> tuple[list[int], str, str | int | None]:
        """The ids as a real engine emits them on the token path: it stops only at the model's
        eos or a ``stop_token_ids`` entry (kept, vLLM's ``stop_reason`` is the id), so a turn
        ended by any other token runs on, the model writing its turn again, to the budget."""
        eos = self.tokenizer.eos_token_id
        asked = {t for t in body.get("stop_token_ids") or [] if isinstance(t, int)}
        for i, token in enumerate(sampled):
            if token == eos or token in asked:
                return sampled[: i + 1], "stop", token if token != eos else None
        if finish == "length" or stop is not None or not sampled:
            return sampled, finish, stop
        run_on = (sampled * (room // len(sampled) + 1))[:room]
        return run_on, "length", None

    def respond_tokens(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        """``/v1/completions`` with a token prompt, shaped like vLLM's ``return_token_ids``."""
        self.check_model(body)
        check_structured_output(token_schema(body), reply)
        pattern = token_regex(body)
        prompt = body.get("prompt")
        vocab = len(self.tokenizer)
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) and 0 <= t < vocab for t in prompt)
        ):
            raise EngineRefusal(400, "prompt must be a non-empty list of token ids")
        room = self.room(prompt, body)
        sampled, finish, _, stop_string = self.sample(reply, room, _stop_strings(body))
        sampled, finish, stop = self.run_to_stop(sampled, finish, stop_string, body, room)
        if pattern is not None and finish != "length":
            check_regex(pattern, self.tokenizer.decode(sampled, skip_special_tokens=True))
        entries = self.logprob_entries(sampled)
        reply_body = {
            "id": "cmpl-" + uuid.uuid4().hex[:24],
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "text": self.tokenizer.decode(sampled, skip_special_tokens=True),
                    "logprobs": {
                        "tokens": [e["token"] for e in entries],
                        "token_logprobs": [e["logprob"] for e in entries],
                        "top_logprobs": None,
                        "text_offset": None,
                    },
                    "finish_reason": "length" if finish == "length" else "stop",
                    "stop_reason": stop,
                    "prompt_token_ids": list(prompt),
                    "token_ids": sampled,
                }
            ],
            "usage": usage_body(len(prompt), len(sampled)),
        }
        self.log.append(reply_body)
        return reply_body

    def respond(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        self.check_model(body)
        check_structured_output(chat_schema(body), reply)
        check_tool_choice(body.get("tool_choice"), reply)
        messages = body.get("messages") or []
        if not self.multimodal and any(map(has_image, messages)):
            raise EngineRefusal(400, f"{self.model_name} is not a multimodal model")
        tools = body.get("tools") or None
        prompt = self.prompt_ids(
            messages, tools, continue_final=body.get("continue_final_message") is True
        )
        sampled, finish, calls, stop = self.sample(
            reply, self.room(prompt, body), _stop_strings(body)
        )
        if body.get("parallel_tool_calls") is False:
            calls = calls[:1]  # as vLLM does: the sampled ids stay whole, the reply keeps one
        content = reply.content.split(stop)[0] if stop else reply.content
        if body.get("tool_choice") == "none" and calls:
            # vLLM parses no calls under tool_choice none: the call's text is the answer.
            text = self.tokenizer.decode(sampled, skip_special_tokens=True)
            content, calls, finish = split_think(text)[1], [], "stop"
        entries = self.logprob_entries(sampled)
        reply_body = {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content or None,
                        "reasoning_content": reply.reasoning,
                        "tool_calls": calls,
                    },
                    "finish_reason": finish,
                    "stop_reason": stop,
                    "token_ids": sampled,
                    "logprobs": {"content": entries},
                }
            ],
            "usage": usage_body(len(prompt), len(sampled)),
        }
        self.log.append(reply_body)
        return reply_body


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _image_tokens(message: dict[str, Any]) -> dict[str, Any]:
    """How the scripted model sees an image it takes (multimodal): its own ``<image>`` text,
    standing in for a vision model's placeholder tokens."""
    if not has_image(message):
        return message
    parts = [
        {"type": "text", "text": "<image>"} if p.get("type") == "image_url" else p
        for p in message["content"]
        if isinstance(p, dict)
    ]
    return {**message, "content": parts}


def has_image(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "image_url" for p in content
    )


def _stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    return [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
