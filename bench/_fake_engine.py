"""A minimal, very fast vLLM stand-in for the gateway benchmark.

It answers ``POST /v1/chat/completions`` with a precomputed vLLM-shaped reply and does no JSON
work per request, so the time a client spends on it is almost all transport: what is left when
the same call goes through a gateway is the gateway's own cost.

* Token fields (``prompt_token_ids``, ``token_ids``, ``logprobs.content``) are returned only when
  the body asks for ``return_token_ids``, as vLLM does: Polar asks, a plain proxy does not.
* The prompt length follows the body size (a Claude-Code-sized body gets 20k prompt ids, a
  Pi-sized one 1.5k), so parsing and storing the prompt ids costs what it would.
* ``"stream": true`` gets a chat-completions SSE stream of the same completion.
* Every reply gets a fresh completion id (captures are keyed by it), patched into the
  precomputed bytes.
* ``--token-ms`` stands for generation: a stream's frames leave one every that many ms (the
  first at once), a whole reply once its last frame would have; 0 (default): all at once.

Run: ``python bench/_fake_engine.py --port 8199``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
from dataclasses import dataclass

SAMPLED_TOKENS = 50
LONG_PROMPT_IDS = 20_000
SHORT_PROMPT_IDS = 1_500
# Bodies above this size are Claude-Code-sized and get the long prompt.
LONG_BODY_BYTES = 30_000
MODEL = "bench-model"
# Stands for the completion id in the precomputed replies; same width as the ids patched in.
ID_MARK = b"chatcmpl-XXXXXXXXXXXXXXXX"
# Frames in a stream: the role, one per text piece, the tool call, finish, usage, [DONE].
STREAM_FRAMES = 1 + (SAMPLED_TOKENS - 20) + 4

_STREAM_RE = re.compile(rb'"stream"\s*:\s*true')
_TOKEN_IDS_RE = re.compile(rb'"return_token_ids"\s*:\s*true')


def _completion_text() -> tuple[str, list[str]]:
    words = ["I", "'ll", " read", " the", " file", " first", " to", " see", " what", " it", " does"]
    pieces = [words[i % len(words)] for i in range(SAMPLED_TOKENS - 20)]
    return "".join(pieces), pieces


def _tool_call() -> dict[str, object]:
    return {
        "id": "chatcmpl-tool-bench0001",
        "type": "function",
        "function": {"name": "Read", "arguments": '{"file_path": "/repo/src/app/main.py"}'},
    }


def chat_reply(prompt_len: int, with_tokens: bool) -> dict[str, object]:
    """A vLLM chat completion: some text, one tool call, and token fields when asked for."""
    rng = random.Random(prompt_len)
    text, _ = _completion_text()
    choice: dict[str, object] = {
        "index": 0,
        "message": {"role": "assistant", "content": text, "tool_calls": [_tool_call()]},
        "finish_reason": "tool_calls",
        "stop_reason": None,
    }
    reply: dict[str, object] = {
        "id": ID_MARK.decode(),
        "object": "chat.completion",
        "created": 1_760_000_000,
        "model": MODEL,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": SAMPLED_TOKENS,
            "total_tokens": prompt_len + SAMPLED_TOKENS,
        },
    }
    if with_tokens:
        reply["prompt_token_ids"] = [rng.randrange(49_152) for _ in range(prompt_len)]
        sampled = [rng.randrange(49_152) for _ in range(SAMPLED_TOKENS)]
        choice["token_ids"] = sampled
        choice["logprobs"] = {
            "content": [
                {
                    "token": f"t{tid}",
                    "logprob": -round(rng.random() * 3, 6),
                    "bytes": list(f"t{tid}".encode()),
                    "top_logprobs": [],
                }
                for tid in sampled
            ]
        }
    return reply


def chat_stream(prompt_len: int) -> bytes:
    """The same completion as chat-completions SSE chunks (what a streaming proxy reads)."""
    _, pieces = _completion_text()
    base = {"id": ID_MARK.decode(), "object": "chat.completion.chunk", "created": 1_760_000_000}
    base["model"] = MODEL
    deltas: list[dict[str, object]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": piece} for piece in pieces]
    call = _tool_call()
    function = call["function"]
    assert isinstance(function, dict)
    deltas.append(
        {"tool_calls": [{"index": 0, "id": call["id"], "type": "function", "function": function}]}
    )
    chunks = [base | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    usage = {
        "prompt_tokens": prompt_len,
        "completion_tokens": SAMPLED_TOKENS,
        "total_tokens": prompt_len + SAMPLED_TOKENS,
    }
    chunks.append(base | {"choices": [], "usage": usage})
    frames = [f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks]
    return ("".join(frames) + "data: [DONE]\n\n").encode()


def http_response(body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


@dataclass(frozen=True)
class Replies:
    """Every reply the engine can give, serialized once at start."""

    by_kind: dict[tuple[bool, bool, bool], list[bytes]]
    health: bytes
    not_found: bytes

    @classmethod
    def build(cls) -> Replies:
        by_kind: dict[tuple[bool, bool, bool], list[bytes]] = {}
        for long in (False, True):
            n = LONG_PROMPT_IDS if long else SHORT_PROMPT_IDS
            for tokens in (False, True):
                body = json.dumps(chat_reply(n, tokens), separators=(",", ":")).encode()
                stream = http_response(chat_stream(n), "text/event-stream")
                by_kind[(long, tokens, False)] = http_response(body).split(ID_MARK)
                by_kind[(long, tokens, True)] = stream.split(ID_MARK)
        health = http_response(b'{"status":"ok"}')
        not_found = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
        return cls(by_kind, health, not_found)


class EngineProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive with Content-Length bodies: all the benchmark's clients send."""

    replies: Replies
    served: int = 0
    token_s: float = 0.0  # 0: every reply at once; else paced as generated (see paced)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            self.respond(head.split(" ", 2), body)

    def respond(self, request_line: list[str], body: bytes) -> None:
        method, path = request_line[0], request_line[1]
        if method == "POST" and path.endswith("/chat/completions"):
            kind = (
                len(body) > LONG_BODY_BYTES,
                bool(_TOKEN_IDS_RE.search(body)),
                bool(_STREAM_RE.search(body)),
            )
            EngineProtocol.served += 1
            completion_id = f"chatcmpl-{EngineProtocol.served:016x}".encode()
            reply = self._with_id(self.replies.by_kind[kind], completion_id)
            if self.token_s:
                self.paced(b"".join(reply), stream=kind[2])
            else:
                self.transport.writelines(reply)
        elif path in ("/health", "/v1/models"):
            self.transport.write(self.replies.health)
        else:
            self.transport.write(self.replies.not_found)

    def paced(self, reply: bytes, stream: bool) -> None:
        """As an engine that generates: a stream's first frame now and one more every
        ``token_s``; a whole reply once all its frames would have been generated."""
        head, _, body = reply.partition(b"\r\n\r\n")
        frames = [f + b"\n\n" for f in body.split(b"\n\n") if f] if stream else []
        loop = asyncio.get_running_loop()
        if not stream:
            loop.call_later(STREAM_FRAMES * self.token_s, self.transport.write, reply)
            return
        self.transport.write(head + b"\r\n\r\n" + frames[0])
        for i, frame in enumerate(frames[1:], start=1):
            loop.call_later(i * self.token_s, self.transport.write, frame)

    @staticmethod
    def _with_id(parts: list[bytes], completion_id: bytes) -> list[bytes]:
        out = [parts[0]]
        for part in parts[1:]:
            out += [completion_id, part]
        return out


async def serve(host: str, port: int, token_ms: float = 0.0) -> None:
    EngineProtocol.replies = Replies.build()
    EngineProtocol.token_s = token_ms / 1000
    loop = asyncio.get_running_loop()
    server = await loop.create_server(EngineProtocol, host, port, backlog=4096)
    print(f"fake engine on http://{host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument(
        "--token-ms",
        type=float,
        default=0.0,
        help="pace replies as generated: a stream frame every TOKEN_MS, a whole reply after all",
    )
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.token_ms))


if __name__ == "__main__":
    main()
