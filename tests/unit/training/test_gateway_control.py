"""GatewayControl against a live gateway: pause around a weight update, stamp, always resume."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from polar.errors import ConfigError
from polar.training.gateway_control import GatewayControl


def test_weight_update_pauses_stamps_and_resumes(live_gateway: Any) -> None:
    url = live_gateway.base_url
    token = live_gateway.admin["x-polar-admin-token"]

    def status(url: str) -> dict[str, Any]:
        return dict(httpx.get(f"{url}/polar/status", headers=live_gateway.admin).json())

    control = GatewayControl([url], token=token, timeout_s=5)
    original = status(url)["policy_version"]  # the gateway is shared with other tests
    try:
        with control.weight_update(7) as drained:
            assert drained is True
            assert status(url)["paused"] is True
        after = status(url)
        assert after["paused"] is False and after["policy_version"] == 7

        with pytest.raises(RuntimeError), control.weight_update(8):
            raise RuntimeError("sync failed")
        after = status(url)
        # a failed sync leaves the node running, and does not claim the new version
        assert after["paused"] is False and after["policy_version"] == 7
    finally:
        control.resume()
        control.set_policy(original)
        control.close()


def test_unreachable_gateway_is_a_clear_error() -> None:
    control = GatewayControl(["http://127.0.0.1:9"], timeout_s=1)
    with pytest.raises(ConfigError, match="cannot reach gateway"):
        control.pause()
    control.close()
