"""gpt-oss (harmony) turns: messages on channels, calls addressed to ``functions.NAME``.

After its generation prompt (``<|start|>assistant``) the model writes one or more messages,
every one after the first opened by ``<|start|>assistant``::

    <|channel|>analysis<|message|>I should list the files.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>
    {"cmd": "ls"}<|call|>

or ``<|channel|>final<|message|>The answer.<|return|>``. The recipient may also stand before
the channel (``assistant to=functions.bash<|channel|>commentary json<|message|>``, as the chat
template writes past calls). All markup is special tokens: the text must be decoded with them
kept. The analysis channel is the reasoning; final (and commentary without a recipient, the
model's preamble to its calls) is the content; a message to a recipient is a call.
No ``call_pattern``: engines' regex grammars do not sample special tokens, so ``tool_choice``
cannot be forced in this format and the gateway refuses it by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.parsers.base import (
    MalformedCall,
    ParsedTurn,
    ToolParser,
    arguments_object,
    loads_json,
    new_call,
)
from polar.rendering.parsers.special_text import strip_trailers

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
# Tokens that close one message; <|call|> and <|return|> also end the sampled turn.
MESSAGE_ENDS = ("<|end|>", "<|call|>", "<|return|>")
TRAILERS = ("<|call|>", "<|return|>", "<|endoftext|>")
_END_RE = re.compile("|".join(re.escape(t) for t in MESSAGE_ENDS))
_RECIPIENT_RE = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL_RE = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


@dataclass
class Message:
    """One harmony message of the sampled turn."""

    channel: str
    recipient: str | None
    body: str
    raw: str


def _header(header: str) -> tuple[str, str | None]:
    """(channel, recipient) of a message header such as ``<|channel|>commentary to=f json``."""
    channel = _CHANNEL_RE.search(header)
    if channel is None:
        raise MalformedCall(f"a message header without a channel: {header!r}")
    recipient = _RECIPIENT_RE.search(header)
    return channel.group(1), recipient.group(1) if recipient else None


def messages(text: str) -> list[Message]:
    """The turn's messages; raises :class:`MalformedCall` when the markup is broken."""
    out = []
    for i, chunk in enumerate(text.split(START)):
        if i == 0 and not chunk.strip():
            continue
        header, sep, rest = chunk.partition(MESSAGE)
        if not sep:
            raise MalformedCall("a message without <|message|>")
        if i > 0 and not header.lstrip().startswith("assistant"):
            raise MalformedCall("a message from another role inside the turn")
        end = _END_RE.search(rest)
        body = rest[: end.start()] if end else rest
        if end and rest[end.end() :].strip():
            raise MalformedCall("text after a message's end")
        channel, recipient = _header(header)
        out.append(Message(channel, recipient, body, (START if i else "") + chunk))
    return out


def _call(message: Message) -> ToolCall:
    recipient = message.recipient or ""
    name = recipient.removeprefix("functions.")
    if not name:
        raise MalformedCall("a call without a function name")
    return new_call(name, arguments_object(loads_json(message.body.strip())))


class HarmonyToolParser(ToolParser):
    """gpt-oss channels: analysis is reasoning, final is content, ``to=functions.X`` calls."""

    name = "openai"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        body = strip_trailers(text, TRAILERS)
        try:
            turn = messages(body)
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        thoughts = [m.body for m in turn if m.channel == "analysis"]
        reasoning = "\n".join(thoughts) if thoughts else None
        spoken = [m for m in turn if m.channel != "analysis"]
        said = [m.body for m in spoken if m.recipient is None]
        try:
            calls = [_call(m) for m in spoken if m.recipient is not None]
        except MalformedCall:
            return ParsedTurn(
                content="".join(m.raw for m in spoken), reasoning=reasoning, tool_calls=[]
            )
        return ParsedTurn(content="\n".join(said), reasoning=reasoning, tool_calls=calls)
