"""A NeMo Gym agent server that runs each rollout as one Polar session.

``POST /run`` turns one Gym row into one Polar task (one sample), waits for its session (Polar's
callback wakes the wait; polling is the fallback and the only source of truth), and returns
Gym's verify response: Responses output items whose last item per model call carries the
exact token ids and logprobs Polar captured, the reward from Polar's evaluator or from a Gym
resources server, and ``mask_sample`` / ``failure_kind`` for failed sessions.

It imports nemo_gym (and its aiohttp client) only, never ``polar``: Gym's venv is Python >= 3.13
with Gym's pins, Polar's is its own. The conversions live in ``convert.py`` (pure, no imports
of either), which Polar's own suite tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote

from convert import RowError, gym_record, rollout_key, task_id_for, task_request
from fastapi import FastAPI, HTTPException, Request
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import get_response_json, raise_for_status, request
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

LOG = logging.getLogger(__name__)
CALLBACK_PATH = "/polar/session_result"


class PolarAgentConfig(BaseResponsesAPIAgentConfig):
    polar_url: str = Field(description="The Polar rollout server, e.g. http://127.0.0.1:8200.")
    polar_token: str | None = Field(
        default=None, description="The rollout server's admin token (Authorization: Bearer)."
    )
    public_url: str | None = Field(
        default=None,
        description="Where Polar's callbacks reach this server; default http://<host>:<port>. "
        "Its host must be in the rollout server's callback_hosts. null + callbacks: false polls.",
    )
    callbacks: bool = Field(default=True, description="Ask Polar to call back when a session ends.")
    reward_source: Literal["polar", "resources_server"] = "polar"
    resources_server: ResourcesServerRef | None = None
    poll_interval_s: float = Field(default=2.0, gt=0)
    wait_timeout_s: float = Field(default=7200.0, gt=0)
    cancel_wait_s: float = Field(
        default=30.0,
        ge=0,
        description="After wait_timeout_s cancels a task, how long to wait for its session's "
        "result (ERROR, failure_kind cancelled, with what it captured) before a stand-in.",
    )
    model_name: str = Field(default="polar", description="The model name written on responses.")
    task_template: dict[str, Any] = Field(
        default_factory=dict, description="A Polar TaskRequest without task_id and instruction."
    )

    @model_validator(mode="after")
    def _verifier_named(self) -> PolarAgentConfig:
        if self.reward_source == "resources_server" and self.resources_server is None:
            raise ValueError("reward_source: resources_server needs resources_server: {type, name}")
        return self


class PolarAgentRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow")


class PolarAgentVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")


class PolarError(RuntimeError):
    """The rollout server refused or could not be reached (a ``/run`` Gym should retry)."""


class PolarAgent(SimpleResponsesAPIAgent):
    config: PolarAgentConfig
    # Fixed per process: task ids of this agent never collide with an earlier run's.
    _nonce: str = PrivateAttr(default_factory=lambda: secrets.token_hex(4))
    _wakeups: dict[str, asyncio.Event] = PrivateAttr(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post(CALLBACK_PATH)(self.session_result)
        return app

    # -- Gym routes ----------------------------------------------------------------------

    async def run(self, request: Request, body: PolarAgentRunRequest) -> PolarAgentVerifyResponse:
        row = body.model_dump(by_alias=True, exclude_none=True)
        if body.capture_rollout_id is not None:
            row["_ng_rollout_id"] = body.capture_rollout_id
        result = await self._run_session(row)
        record = self._record(result)
        if self.config.reward_source == "resources_server":
            record = await self._verify_with_gym(request, body, record)
        return PolarAgentVerifyResponse.model_validate(
            {**body.model_dump(exclude_none=True), **record}
        )

    async def responses(
        self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        """One Polar session for one agent turn, without verification."""
        result = await self._run_session({"responses_create_params": body.model_dump()})
        return NeMoGymResponse.model_validate(self._record(result)["response"])

    async def session_result(self, request: Request) -> dict[str, bool]:
        """Polar's per-session callback. Unauthenticated, so it only wakes the wait: the
        result itself is read back from the rollout server with the admin token."""
        body = await request.json()
        task_id = body.get("task_id") if isinstance(body, Mapping) else None
        event = self._wakeups.get(task_id) if isinstance(task_id, str) else None
        if event is not None:
            event.set()
        return {"ok": True}

    # -- Polar ---------------------------------------------------------------------------

    async def _run_session(self, row: dict[str, Any]) -> dict[str, Any]:
        key = rollout_key(row) or secrets.token_hex(8)
        task_id = task_id_for(self._nonce, key)
        try:
            task = task_request(
                row, self.config.task_template, task_id=task_id, callback_url=self._callback_url()
            )
        except RowError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        wakeup = self._wakeups[task_id] = asyncio.Event()
        try:
            if await self._task_result(task_id) is None:
                await self._submit(task)
            return await self._wait(task_id, wakeup)
        except asyncio.CancelledError:
            await self._cancel(task_id)
            raise
        finally:
            self._wakeups.pop(task_id, None)

    async def _wait(self, task_id: str, wakeup: asyncio.Event) -> dict[str, Any]:
        deadline = time.monotonic() + self.config.wait_timeout_s
        while True:
            summary = await self._polar("GET", f"/tasks/{quote(task_id)}/summary")
            if summary["status"] == "COMPLETED":
                result = await self._task_result(task_id)
                if result is not None:
                    return result
            left = deadline - time.monotonic()
            if left <= 0:
                return await self._give_up(task_id, wakeup)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), min(self.config.poll_interval_s, left))
            wakeup.clear()

    async def _give_up(self, task_id: str, wakeup: asyncio.Event) -> dict[str, Any]:
        """Cancel a task that ran past ``wait_timeout_s`` and return its session's result once
        the node reports it (``cancel_wait_s``); a stand-in if it does not, or cannot."""
        await self._cancel(task_id)
        deadline = time.monotonic() + self.config.cancel_wait_s
        while True:
            try:
                result = await self._task_result(task_id)
            except PolarError as exc:
                LOG.warning("could not read cancelled Polar task %s: %s", task_id, exc)
                result = None
            if result is not None:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                return _abandoned(task_id, self.config.wait_timeout_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), min(self.config.poll_interval_s, left))
            wakeup.clear()

    async def _task_result(self, task_id: str) -> dict[str, Any] | None:
        """The task's one session result once it is final; None while it runs or is unknown."""
        body = await self._polar("GET", f"/tasks/{quote(task_id)}", allow=(404,))
        if body is None or body.get("status") != "COMPLETED" or not body.get("results"):
            return None
        return dict(body["results"][0])

    async def _submit(self, task: dict[str, Any]) -> None:
        # The same request again (a retried /run) answers the existing task (200); a 409 means
        # a different task holds the id, and its result must not be taken for ours.
        await self._polar("POST", "/tasks", json=task)

    async def _cancel(self, task_id: str) -> None:
        """Stop an abandoned task's session; a server without ``DELETE /tasks`` lets it run."""
        try:
            await self._polar("DELETE", f"/tasks/{quote(task_id)}", allow=(404, 405, 409))
        except Exception as exc:  # best effort: the /run is being abandoned anyway
            LOG.warning("could not cancel Polar task %s: %r", task_id, exc)

    async def _polar(
        self, method: str, path: str, *, json: Any = None, allow: tuple[int, ...] = ()
    ) -> Any:
        headers = (
            {"authorization": f"Bearer {self.config.polar_token}"}
            if self.config.polar_token
            else {}
        )
        kwargs: dict[str, Any] = {"headers": headers}
        if json is not None:
            kwargs["json"] = json
        url = self.config.polar_url.rstrip("/") + path
        try:
            reply = await request(method, url, **kwargs)
        except Exception as exc:
            raise PolarError(f"{method} {url}: {exc!r}") from exc
        if reply.status in allow:
            return None
        if reply.status >= 400:
            text = (await reply.read()).decode(errors="replace")[:500]
            raise PolarError(f"{method} {url}: HTTP {reply.status}: {text}")
        if reply.status == 204:
            return None
        return await get_response_json(reply)

    def _callback_url(self) -> str | None:
        if not self.config.callbacks:
            return None
        if self.config.public_url:
            return self.config.public_url.rstrip("/") + CALLBACK_PATH
        host = self.config.host if self.config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"http://{host}:{self.config.port}{CALLBACK_PATH}"

    def _record(self, result: Mapping[str, Any]) -> dict[str, Any]:
        return gym_record(
            result,
            response_id=f"resp_{result.get('session_id') or secrets.token_hex(8)}",
            model=self.config.model_name,
            created_at=int(time.time()),
            polar_reward=self.config.reward_source == "polar",
        )

    # -- Gym verifier --------------------------------------------------------------------

    async def _verify_with_gym(
        self, request: Request, body: PolarAgentRunRequest, record: dict[str, Any]
    ) -> dict[str, Any]:
        """Grade the session's output with a Gym resources server (``/seed_session`` then
        ``/verify``); Polar's own reward stays as ``polar_reward``."""
        assert self.config.resources_server is not None
        server = self.config.resources_server.name
        row = body.model_dump(exclude_none=True)
        seed = await self.server_client.post(
            server_name=server, url_path="/seed_session", json=row, cookies=request.cookies
        )
        await raise_for_status(seed)
        verify = await self.server_client.post(
            server_name=server,
            url_path="/verify",
            json=row | {"response": record["response"]},
            cookies=seed.cookies,
        )
        await raise_for_status(verify)
        verdict = await get_response_json(verify)
        merged = {**verdict, **{k: v for k, v in record.items() if k.startswith("polar_")}}
        merged["response"] = record["response"]
        merged["mask_sample"] = bool(record["mask_sample"] or verdict.get("mask_sample"))
        for name in ("failure_kind", "failure_reason"):
            merged[name] = record[name] or verdict.get(name)
        return merged


def _abandoned(task_id: str, waited_s: float) -> dict[str, Any]:
    """A stand-in result for a task that did not finish in time (masked: no trace)."""
    return {
        "task_id": task_id,
        "status": "TIMEOUT",
        "failure": {
            "kind": "timeout",
            "reason": f"Polar did not finish task {task_id} within wait_timeout_s={waited_s:g}",
        },
    }


if __name__ == "__main__":
    PolarAgent.run_webserver()
