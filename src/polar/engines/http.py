"""How engine requests travel: aiohttp to a server, or httpx's ASGI transport in-process.

The gateway's hot path is one engine POST per model call. aiohttp's connection pool stays cheap
at hundreds of concurrent sessions (httpx's pool scans every connection per request, which the
gateway benchmark measured as its largest cost); in-process engines (scripted, embedded) are
called through httpx's ASGI transport with no socket at all.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
import httpx

from polar.errors import EngineTimeout, EngineUnavailable


@dataclass
class RawReply:
    status: int
    headers: Mapping[str, str]
    content: bytes


class EngineHTTP(ABC):
    """POST bytes to an engine path; map transport failures to typed engine errors."""

    def __init__(self, base_url: str, headers: Mapping[str, str], timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers)
        self.timeout_s = timeout_s

    @abstractmethod
    async def post(
        self, path: str, content: bytes, headers: Mapping[str, str] | None = None
    ) -> RawReply: ...

    @abstractmethod
    async def get(self, path: str) -> RawReply: ...

    @abstractmethod
    async def aclose(self) -> None: ...

    def _timeout(self, exc: BaseException) -> EngineTimeout:
        return EngineTimeout(
            f"engine at {self.base_url} timed out after {self.timeout_s:g} s: {exc!r}"
        )

    def _unreachable(self, exc: BaseException) -> EngineUnavailable:
        # The exception's message, not its repr: aiohttp's repr dumps connection internals.
        reason = str(exc) or type(exc).__name__
        return EngineUnavailable(f"engine at {self.base_url} is unreachable: {reason}")


class AiohttpEngineHTTP(EngineHTTP):
    """A pooled aiohttp session, created lazily inside the running event loop."""

    def __init__(
        self, base_url: str, headers: Mapping[str, str], timeout_s: float, max_connections: int
    ) -> None:
        super().__init__(base_url, headers, timeout_s)
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self.headers,
                connector=aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10.0),
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def post(
        self, path: str, content: bytes, headers: Mapping[str, str] | None = None
    ) -> RawReply:
        try:
            async with self._client().post(
                self.base_url + path, data=content, headers=headers
            ) as response:
                return RawReply(response.status, response.headers, await response.read())
        except TimeoutError as exc:
            raise self._timeout(exc) from exc
        except aiohttp.ClientError as exc:
            raise self._unreachable(exc) from exc

    async def get(self, path: str) -> RawReply:
        try:
            async with self._client().get(self.base_url + path) as response:
                return RawReply(response.status, response.headers, await response.read())
        except TimeoutError as exc:
            raise self._timeout(exc) from exc
        except aiohttp.ClientError as exc:
            raise self._unreachable(exc) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpxEngineHTTP(EngineHTTP):
    """httpx over a given transport (``httpx.ASGITransport`` for in-process engines)."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        timeout_s: float,
        transport: httpx.AsyncBaseTransport,
    ) -> None:
        super().__init__(base_url, headers, timeout_s)
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, transport=transport, timeout=timeout_s
        )

    async def post(
        self, path: str, content: bytes, headers: Mapping[str, str] | None = None
    ) -> RawReply:
        try:
            # httpx timeouts are per read; the engine's budget bounds the call as a whole.
            response = await asyncio.wait_for(
                self._client.post(path, content=content, headers=headers), self.timeout_s
            )
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise self._timeout(exc) from exc
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        return RawReply(response.status_code, response.headers, response.content)

    async def get(self, path: str) -> RawReply:
        try:
            response = await asyncio.wait_for(self._client.get(path), self.timeout_s)
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise self._timeout(exc) from exc
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        return RawReply(response.status_code, response.headers, response.content)

    async def aclose(self) -> None:
        await self._client.aclose()
