"""A trainer's client of the rollout server: submit tasks, wait for their results.

Every bridge and the embedded trainer talk to Polar through this one client, over the rollout
server's public HTTP API, so a trainer in another process (or on another machine) sees exactly
what an in-process one sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import httpx

from polar.errors import ConfigError
from polar.schemas.task import TaskRequest, TaskResult

TASK_DONE = "COMPLETED"
# A dropped connection (a keep-alive race, a restart) is retried this often before it counts.
TRANSPORT_RETRIES = 5
RETRY_DELAY_S = 0.2


class RolloutTimeout(TimeoutError):
    """The rollout server did not finish a task in time."""


class RolloutClient:
    """Synchronous client (trainers call it from their training loop)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        poll_s: float = 0.1,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.poll_s = poll_s
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )

    def submit(self, task: TaskRequest) -> None:
        body = task.model_dump_json(exclude_unset=True)
        for attempt in range(TRANSPORT_RETRIES + 1):
            try:
                reply = self.http.post(
                    "/tasks", content=body, headers={"content-type": "application/json"}
                )
            except httpx.TransportError:
                if attempt == TRANSPORT_RETRIES:
                    raise
                time.sleep(RETRY_DELAY_S * (attempt + 1))
                continue
            if reply.status_code == 409 and attempt > 0:
                return  # an earlier attempt got through before its answer was lost
            _check(reply, f"submitting task {task.task_id!r}")
            return

    def result(self, task_id: str) -> TaskResult:
        for attempt in range(TRANSPORT_RETRIES + 1):
            try:
                reply = self.http.get(f"/tasks/{task_id}")
                break
            except httpx.TransportError:
                # e.g. a keep-alive connection the server closed as we reused it
                if attempt == TRANSPORT_RETRIES:
                    raise
                time.sleep(RETRY_DELAY_S * (attempt + 1))
        return TaskResult.model_validate(_check(reply, f"reading task {task_id!r}"))

    def wait(
        self,
        task_ids: Iterable[str],
        timeout_s: float,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, TaskResult]:
        """Poll until every task is COMPLETED (all its sessions final); results by task id.
        ``progress`` hears the number of finished sessions whenever it grows."""
        pending = list(task_ids)
        done: dict[str, TaskResult] = {}
        deadline = time.monotonic() + timeout_s
        reported = 0
        while pending:
            still = []
            partial = 0
            for task_id in pending:
                result = self.result(task_id)
                if result.status == TASK_DONE:
                    done[task_id] = result
                else:
                    still.append(task_id)
                    partial += len(result.results)
            pending = still
            finished = partial + sum(len(r.results) for r in done.values())
            if progress is not None and finished > reported:
                reported = finished
                progress(finished)
            if pending:
                if time.monotonic() > deadline:
                    raise RolloutTimeout(
                        f"{len(pending)} task(s) unfinished after {timeout_s:.0f}s: "
                        + ", ".join(pending[:5])
                    )
                time.sleep(self.poll_s)
        return done

    def run(
        self,
        tasks: Sequence[TaskRequest],
        timeout_s: float,
        progress: Callable[[int], None] | None = None,
    ) -> list[TaskResult]:
        """Submit ``tasks`` and wait for all of them; results in submission order."""
        for task in tasks:
            self.submit(task)
        done = self.wait([t.task_id for t in tasks], timeout_s, progress)
        return [done[t.task_id] for t in tasks]

    def node_urls(self) -> list[str]:
        """The registered, live gateway nodes (for pausing them around weight updates)."""
        nodes = _check(self.http.get("/nodes"), "listing nodes")
        return [n["url"] for n in nodes if n.get("url") and not n.get("dead")]

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(reply: httpx.Response, doing: str) -> Any:
    if reply.is_error:
        raise ConfigError(f"rollout server answered HTTP {reply.status_code} {doing}: {reply.text}")
    return reply.json()
