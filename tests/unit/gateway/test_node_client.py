"""A node's side of the rollout protocol: results delivered until acknowledged, registration
and heartbeats that survive a server that fails, answers garbage, or forgets the node."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx
import pytest

from polar.gateway.config import NodeConfig
from polar.gateway.node.node_client import NodeClient
from polar.schemas.node import NodeStatus, Registered, Workers
from polar.schemas.task import SessionResult, SessionStatus

Answer = int | bytes | Exception


class Server:
    """A rollout server answering ``script`` in order, then 200 to everything."""

    def __init__(self, *script: Answer) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.script.pop(0) if self.script else 200
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, bytes):
            return httpx.Response(200, content=answer)
        if answer == 200 and request.url.path.startswith("/nodes"):
            registered = Registered(node_id="n1", heartbeat_s=0.05)
            return httpx.Response(200, content=registered.model_dump_json())
        return httpx.Response(answer, text="scripted")

    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests]


def node(server: Server) -> NodeClient:
    config = NodeConfig(
        node_id="n1", rollout_url="http://rollout/", heartbeat_s=0.2, report_backoff_max_s=0.01
    )
    status = NodeStatus(
        node_id="n1",
        url="http://n1:8000",
        workers=Workers(init=1, run=1, postrun=1, ready_buffer=0, queue_limit=4),
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    return NodeClient(config, lambda: status, dict, client=client)


def result(sid: str = "s1") -> SessionResult:
    return SessionResult(session_id=sid, task_id="t", status=SessionStatus.COMPLETED, reward=1)


async def until(check: Callable[[], bool], timeout: float = 3.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_a_result_is_retried_until_acknowledged_and_owed_until_then() -> None:
    server = Server(httpx.ConnectError("down"), 500, 401, 503, 200)
    client = node(server)
    await client.deliver(result())
    await client.deliver(result())  # already under way: not queued twice
    assert client.undelivered == 1
    assert client.report().sessions == {"s1": SessionStatus.COMPLETED}
    await until(lambda: client.undelivered == 0)
    assert server.paths() == ["/results"] * 5
    assert {r.headers["idempotency-key"] for r in server.requests} == {"s1"}
    assert SessionResult.model_validate_json(server.requests[-1].content) == result()
    assert client.report().sessions == {}
    await client.stop()


@pytest.mark.parametrize("status", [404, 422])
async def test_a_refused_result_is_dropped_after_one_attempt(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server(status, 200)
    client = node(server)
    with caplog.at_level(logging.ERROR, logger="polar.gateway.node"):
        await client.deliver(result())
        await until(lambda: client.undelivered == 0)
    assert len(server.requests) == 1
    assert f"refused the result of s1: HTTP {status}" in caplog.text
    await client.stop()


async def test_registers_through_failures_and_again_when_forgotten() -> None:
    garbled = b"<html>a proxy's error page</html>"
    # register: down, 500, a garbled 200, ok; heartbeat: ok, 404 (forgotten); register: ok
    server = Server(httpx.ConnectError("down"), 500, garbled, 200, 200, 404, 200)
    client = node(server)
    client.start()
    await until(lambda: len(server.requests) >= 8)
    register, heartbeat = "/nodes/register", "/nodes/n1/heartbeat"
    assert server.paths()[:8] == [register] * 4 + [heartbeat] * 2 + [register, heartbeat]
    assert client.registered.is_set()
    assert client._interval == 0.05  # the server asked for more often than configured
    await client.stop()
    assert client._loop is not None and client._loop.cancelled()


async def test_stop_gives_pending_deliveries_time_to_finish() -> None:
    server = Server(503, 200)
    client = node(server)
    await client.deliver(result())
    await client.stop(flush_s=2)
    assert client.undelivered == 0 and len(server.requests) == 2
