"""A streamed reply that is alive from its first moments.

The headers wait a short grace (:func:`early_refusal`): an engine that refuses (a full queue's
429, a 400) answers in milliseconds, and that refusal keeps its HTTP status, so an SDK retries
and backs off as it would against the provider (it retries on the status, never on an error
inside a 200 stream). Then the headers leave; while the engine works, the provider's keep-alive
frames follow every ``keepalive_s`` seconds (idle timeouts such as Codex's 300 s see a live
stream); the content frames follow only once the completion exists and its record is durable,
so the capture is complete before a harness sees any content. A failure after the headers goes
out as the provider's in-stream error event, which each SDK raises as its own exception.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable

from starlette.responses import StreamingResponse

from polar.errors import ClientDisconnected, GatewayError
from polar.providers.base import Provider
from polar.providers.types import Completion, NormalizedRequest

log = logging.getLogger("polar.gateway")

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def early_refusal(work: asyncio.Future[Completion], grace_s: float) -> GatewayError | None:
    """Waits up to ``grace_s`` for ``work``: the error it failed with in that time, which the
    caller then gets with its own HTTP status (None: still working, done, or the caller left)."""
    try:
        await asyncio.wait({work}, timeout=grace_s)
    except asyncio.CancelledError:
        work.cancel()
        raise
    if not work.done() or work.cancelled():
        return None
    error = work.exception()
    if isinstance(error, GatewayError) and not isinstance(error, ClientDisconnected):
        return error
    return None


def live_stream(
    provider: Provider,
    request: NormalizedRequest,
    completion: Awaitable[Completion],
    keepalive_s: float,
) -> StreamingResponse:
    """The streamed reply to ``request``; ``completion`` produces and captures the completion."""
    return StreamingResponse(
        live_frames(provider, request, completion, keepalive_s),
        media_type="text/event-stream",
        headers=_SSE_HEADERS,
    )


async def live_frames(
    provider: Provider,
    request: NormalizedRequest,
    completion: Awaitable[Completion],
    keepalive_s: float,
) -> AsyncIterator[bytes]:
    """Keep-alive frames until ``completion`` is done, then its frames or an error event."""
    work = asyncio.ensure_future(completion)
    try:
        while not work.done():
            done, _ = await asyncio.wait({work}, timeout=keepalive_s)
            if not done:
                yield provider.keep_alive()
        try:
            result = work.result()
        except ClientDisconnected:
            return
        except GatewayError as err:
            yield provider.stream_error(err)
            return
        except Exception as exc:  # a bug must still end the stream in the caller's shape
            log.exception("unexpected gateway error in a stream")
            yield provider.stream_error(GatewayError(f"internal gateway error: {exc!r}"))
            return
        yield b"".join(provider.render_stream(result, request))
    finally:
        work.cancel()  # the caller left mid-stream: stop the engine call (no-op once done)
