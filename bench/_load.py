"""A lean closed-loop HTTP/1.1 load generator: N sessions, one keep-alive connection each.

Requests are serialized once, up front; a session sends its next request as soon as the previous
reply has been read in full. The client does no JSON work, so on a 2-core machine it leaves the
CPU to the servers under test (httpx would spend about as much per request as a gateway does).
Replies with Content-Length and chunked replies (streaming proxies) are both read to the end.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path


def encode_request(
    method: str, host: str, path: str, body: bytes, headers: dict[str, str]
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in {"content-type": "application/json", **headers}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Connection:
    """One keep-alive connection; reconnects when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, data: bytes) -> tuple[int, bytes]:
        reused = self.writer is not None
        if (
            self.writer is None
            or self.writer.is_closing()
            or self.reader is None
            or self.reader.at_eof()
        ):
            await self.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            reused = False
        assert self.reader is not None and self.writer is not None
        self.writer.write(data)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            if not reused:
                raise
            # The server closed the idle keep-alive connection as we reused it: send again.
            await self.close()
            return await self.request(data)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "content-length" in fields:
            body = await self.reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked()
        else:
            body = await self.reader.read()
            await self.close()
        if fields.get("connection", "").lower() == "close":
            await self.close()
        return status, body

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append((await self.reader.readexactly(size + 2))[:-2])

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its descendants (Linux /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                stack += [int(c) for c in children]
        except (OSError, ValueError):
            continue
    return total


@dataclass
class CellResult:
    latencies_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    errors: int = 0
    first_error: str = ""
    cpu_s: float = 0.0
    sample: bytes = b""

    @property
    def rps(self) -> float:
        return len(self.latencies_ms) / self.elapsed_s if self.elapsed_s else 0.0

    def percentile(self, q: float) -> float:
        data = sorted(self.latencies_ms)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, round(q / 100 * (len(data) - 1)))]


async def run_cell(
    host: str,
    port: int,
    requests: list[bytes],
    total: int,
    max_seconds: float,
    cpu_pid: int | None = None,
    warmup: int = 1,
    think_s: float = 0.0,
) -> CellResult:
    """``len(requests)`` sessions (one request each, sent over and over) until ``total`` replies
    or ``max_seconds``, after about ``warmup`` unmeasured requests spread over the sessions.

    With ``think_s`` each session waits a random time (uniform, mean ``think_s``) before each
    call, as an agent does while tokens are generated and tools run; without it sessions send
    back to back and the server under test is saturated."""
    result = CellResult()
    conns = [Connection(host, port) for _ in requests]
    rounds, first = -(-warmup // len(conns)), min(warmup, len(conns))
    for _ in range(rounds):
        await asyncio.gather(*(c.request(r) for c, r in zip(conns[:first], requests, strict=False)))
    remaining = total
    deadline = time.perf_counter() + max_seconds

    async def session(conn: Connection, data: bytes) -> None:
        nonlocal remaining
        rng = random.Random(id(conn))
        while remaining > 0 and time.perf_counter() < deadline:
            if think_s:
                await asyncio.sleep(
                    min(rng.uniform(0, 2 * think_s), deadline - time.perf_counter())
                )
                if time.perf_counter() >= deadline:
                    break
            remaining -= 1
            started = time.perf_counter()
            status, body = await conn.request(data)
            result.latencies_ms.append((time.perf_counter() - started) * 1000)
            if status != 200:
                result.errors += 1
                result.first_error = result.first_error or f"HTTP {status}: {body[:300]!r}"
            elif not result.sample:
                result.sample = body

    cpu_before = process_cpu_s(cpu_pid) if cpu_pid else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(session(c, r) for c, r in zip(conns, requests, strict=True)))
    result.elapsed_s = time.perf_counter() - started
    if cpu_pid:
        result.cpu_s = process_cpu_s(cpu_pid) - cpu_before
    for conn in conns:
        await conn.close()
    return result
