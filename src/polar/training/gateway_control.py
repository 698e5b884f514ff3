"""Pausing gateway generation around a weight update, and stamping the new policy version.

Trainers whose weights live outside Polar (slime, verl, TRL with a vLLM server) call
:meth:`GatewayControl.weight_update` around their sync: every node stops admitting new engine
calls and drains those in flight, the trainer pushes weights to the engine, then every node
records the new policy version and resumes. Calls held back while paused wait (up to the
gateway's pause limit) instead of failing, so harnesses never see the update.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx

from polar.errors import ConfigError


class GatewayControl:
    """The admin routes ``/polar/pause``, ``/polar/resume`` and ``/polar/policy`` of some nodes."""

    def __init__(
        self,
        gateway_urls: Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.urls = [u.rstrip("/") for u in gateway_urls]
        self.http = httpx.Client(headers=headers, timeout=timeout_s + 5, transport=transport)
        self.timeout_s = timeout_s

    def pause(self) -> bool:
        """Stop new generation everywhere; True when every node drained its in-flight calls."""
        drained = True
        for url in self.urls:
            body = self._post(f"{url}/polar/pause", {"timeout_s": self.timeout_s})
            drained = drained and bool(body.get("drained"))
        return drained

    def resume(self) -> None:
        for url in self.urls:
            self._post(f"{url}/polar/resume", None)

    def set_policy(self, version: int) -> None:
        for url in self.urls:
            self._post(f"{url}/polar/policy", {"policy_version": version})

    @contextmanager
    def weight_update(self, new_version: int) -> Iterator[bool]:
        """Pause, let the caller update weights, stamp ``new_version``, resume (even on error,
        so a failed sync never leaves the nodes paused); yields whether the drain completed."""
        drained = self.pause()
        try:
            yield drained
            self.set_policy(new_version)
        finally:
            self.resume()

    def close(self) -> None:
        self.http.close()

    def _post(self, url: str, body: dict[str, object] | None) -> dict[str, object]:
        try:
            reply = self.http.post(url, json=body) if body is not None else self.http.post(url)
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach gateway admin route {url}: {exc}") from exc
        if reply.is_error:
            raise ConfigError(f"gateway {url} answered HTTP {reply.status_code}: {reply.text}")
        data = reply.json()
        return data if isinstance(data, dict) else {}
