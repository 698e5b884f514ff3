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
import re
import time
from dataclasses import dataclass, field
from pathlib import Path


def encode_request(
    method: str, host: str, path: str, body: bytes, headers: dict[str, str]
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in {"content-type": "application/json", **headers}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Reply:
    """One reply: its status, body, and when (seconds after the request left) its first byte
    and its first content event arrived (``content_s`` is None without a marker, or if the
    marker never occurred)."""

    status: int = 0
    body: bytes = b""
    first_byte_s: float = 0.0
    content_s: float | None = None


class _Parts:
    """A reply body as it arrives; notes the first read in which ``marker`` occurs."""

    def __init__(self, marker: re.Pattern[bytes] | None, started: float, reply: Reply) -> None:
        self.marker, self.started, self.reply = marker, started, reply
        self.pieces: list[bytes] = []
        self.tail = b""

    def add(self, piece: bytes) -> None:
        self.pieces.append(piece)
        if self.marker is None or self.reply.content_s is not None:
            return
        if self.marker.search(self.tail + piece):
            self.reply.content_s = time.perf_counter() - self.started
        self.tail = piece[-256:]


class Connection:
    """One keep-alive connection; reconnects when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, data: bytes) -> tuple[int, bytes]:
        reply = await self.exchange(data)
        return reply.status, reply.body

    async def exchange(self, data: bytes, marker: re.Pattern[bytes] | None = None) -> Reply:
        """Send ``data``, read the reply to its end, and time its first byte and (when
        ``marker`` is given) the first read in which ``marker`` occurs: a stream's first content
        event. The body is read as it arrives, so a stream's times are when its parts came."""
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
        started = time.perf_counter()
        self.writer.write(data)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            if not reused:
                raise
            # The server closed the idle keep-alive connection as we reused it: send again.
            await self.close()
            return await self.exchange(data, marker)
        reply = Reply(first_byte_s=time.perf_counter() - started)
        lines = head.decode("latin-1").split("\r\n")
        reply.status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        parts = _Parts(marker, started, reply)
        if "content-length" in fields:
            left = int(fields["content-length"])
            while left > 0:
                piece = await self.reader.read(min(left, 1 << 16))
                if not piece:
                    raise asyncio.IncompleteReadError(b"", left)
                parts.add(piece)
                left -= len(piece)
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            await self._chunked(parts)
        else:
            parts.add(await self.reader.read())
            await self.close()
        if fields.get("connection", "").lower() == "close":
            await self.close()
        reply.body = b"".join(parts.pieces)
        return reply

    async def _chunked(self, parts: _Parts) -> None:
        assert self.reader is not None
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return
            parts.add((await self.reader.readexactly(size + 2))[:-2])

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


# -- paced mixes: many sessions, each cycling through several kinds of call ---------------------


@dataclass(frozen=True)
class Call:
    """One kind of call: a label for the report, the request, and its first-content marker."""

    label: str
    data: bytes
    marker: re.Pattern[bytes] | None = None


@dataclass
class CallTimes:
    """Per kind of call: client latency, time to first byte, time to first content event."""

    latency_ms: list[float] = field(default_factory=list)
    first_byte_ms: list[float] = field(default_factory=list)
    content_ms: list[float] = field(default_factory=list)


@dataclass
class ProcessPeak:
    """What a server process held during a cell (sampled; resident memory and descriptors)."""

    rss_kib: int = 0
    fds: int = 0


@dataclass
class MixResult:
    by_label: dict[str, CallTimes] = field(default_factory=dict)
    acknowledged: list[int] = field(default_factory=list)  # 200 replies, per session
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    wait_s: float = 0.0  # runnable but waiting for a CPU (see process_wait_s)
    errors: int = 0
    first_error: str = ""
    peak: ProcessPeak = field(default_factory=ProcessPeak)
    samples: dict[str, bytes] = field(default_factory=dict)  # one body per label

    @property
    def calls(self) -> int:
        return sum(len(t.latency_ms) for t in self.by_label.values())


def percentile(data: list[float], q: float) -> float:
    ordered = sorted(data)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def process_wait_s(pid: int) -> float:
    """Seconds the threads of ``pid`` now alive have spent runnable but waiting for a CPU
    (/proc/<pid>/task/*/schedstat): on a shared machine, how much other load starved it."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def process_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def process_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _watch(pid: int, peak: ProcessPeak, every_s: float) -> None:
    while True:
        try:
            peak.rss_kib = max(peak.rss_kib, process_rss_kib(pid))
            peak.fds = max(peak.fds, process_fds(pid))
        except OSError:
            return
        await asyncio.sleep(every_s)


async def run_paced_mix(
    host: str,
    port: int,
    sessions: list[list[Call]],
    seconds: float,
    think_s: float,
    pid: int | None = None,
) -> MixResult:
    """Every session waits a think time (uniform, mean ``think_s``; the first one spreads the
    sessions' starts), sends its next kind of call (session ``i`` starts at its list's ``i``-th
    entry and cycles), and repeats until ``seconds`` have passed; a call under way then ends.
    With ``pid``, that process's CPU time over the cell and its peak RSS and descriptors."""
    result = MixResult(acknowledged=[0] * len(sessions))
    deadline = time.perf_counter() + seconds

    async def session(index: int, calls: list[Call]) -> None:
        conn = Connection(host, port)
        rng = random.Random(index)
        turn = index
        try:
            while True:
                pause = rng.uniform(0, 2 * think_s)
                await asyncio.sleep(min(pause, max(0.0, deadline - time.perf_counter())))
                if time.perf_counter() >= deadline:
                    return
                call = calls[turn % len(calls)]
                turn += 1
                started = time.perf_counter()
                try:
                    reply = await conn.exchange(call.data, call.marker)
                except (OSError, asyncio.IncompleteReadError) as exc:
                    result.errors += 1
                    result.first_error = result.first_error or repr(exc)
                    await conn.close()
                    continue
                times = result.by_label.setdefault(call.label, CallTimes())
                times.latency_ms.append((time.perf_counter() - started) * 1000)
                times.first_byte_ms.append(reply.first_byte_s * 1000)
                if reply.content_s is not None:
                    times.content_ms.append(reply.content_s * 1000)
                if reply.status == 200:
                    result.acknowledged[index] += 1
                    result.samples.setdefault(call.label, reply.body)
                else:
                    result.errors += 1
                    result.first_error = result.first_error or (
                        f"{call.label}: HTTP {reply.status}: {reply.body[:300]!r}"
                    )
        finally:
            await conn.close()

    watcher = asyncio.create_task(_watch(pid, result.peak, 0.5)) if pid else None
    cpu_before = process_cpu_s(pid) if pid else 0.0
    wait_before = process_wait_s(pid) if pid else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(session(i, calls) for i, calls in enumerate(sessions)))
    result.elapsed_s = time.perf_counter() - started
    if pid:
        result.cpu_s = process_cpu_s(pid) - cpu_before
        result.wait_s = process_wait_s(pid) - wait_before
    if watcher is not None:
        watcher.cancel()
    return result
