"""A node's connection cap leaves room for its sandboxes' gateway relays.

Each sandbox that cuts the network reaches the gateway through a relay in the gateway process:
a listening unix socket and up to ``SANDBOX_LIMITS.max_connections`` connections, none of them
under the gateway server's own cap. A node's reserve counts them, so a flood of client
connections cannot take the descriptors its sandboxes' harnesses need to call the model.
"""

from __future__ import annotations

import logging
import resource
from pathlib import Path

import pytest

from polar.gateway.config import GatewayConfig, NodeConfig
from polar.runtimes.gateway_relay import SANDBOX_LIMITS, relay_descriptors
from polar.serving import connection_cap

ULIMIT = 4096


def test_a_node_reserves_its_sandbox_relays_descriptors(tmp_path: Path) -> None:
    node = NodeConfig(run_workers=4, postrun_workers=2, ready_buffer=4)
    config = GatewayConfig(capture_db=tmp_path / "c.db", node=node)
    assert node.sandboxes_at_once() == 10
    relays = 10 * (1 + SANDBOX_LIMITS.max_connections)
    assert relay_descriptors(10) == relays
    limits = config.server_limits()
    assert limits.reserved_fds == config.limits.reserved_fds + relays
    cap = connection_cap(limits, ULIMIT)
    # Every client connection with its engine connection, every relay at its cap, and the
    # store's and logs' reserve: all within the descriptor limit.
    assert 2 * cap + relays + config.limits.reserved_fds <= ULIMIT
    assert config.limits.reserved_fds == 128  # the configured value itself is unchanged


def test_a_gateway_without_a_node_keeps_its_configured_limits(tmp_path: Path) -> None:
    config = GatewayConfig(capture_db=tmp_path / "c.db")
    assert config.server_limits() == config.limits
    inline = NodeConfig(run_workers=3, postrun_workers=1, ready_buffer=0)  # INIT in run workers
    assert inline.sandboxes_at_once() == 4


def test_relays_the_limit_cannot_hold_leave_the_server_its_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 run slots ask 67,000 descriptors for relays at their cap: the whole reserve left a
    node with 20,000 a cap of one connection, and it refused every harness and the rollout
    server (bench/rollout_scale.py). The relays get half of what is left; a warning names the
    limit that holds both."""
    monkeypatch.setattr(resource, "getrlimit", lambda _: (20_000, 20_000))
    node = NodeConfig(run_workers=1000, postrun_workers=8, ready_buffer=32, queue_limit=1000)
    config = GatewayConfig(capture_db=tmp_path / "c.db", node=node)
    with caplog.at_level(logging.WARNING, logger="polar.gateway"):
        limits = config.server_limits()
    share = (20_000 - config.limits.reserved_fds) // 2
    assert limits.reserved_fds == config.limits.reserved_fds + share
    assert connection_cap(limits, 20_000) == config.limits.max_connections  # 1024, not 1
    needed = config.limits.reserved_fds + relay_descriptors(1040) + 2 * 1024
    assert f"raise the hard limit (ulimit -Hn, LimitNOFILE) to {needed}" in caplog.text
