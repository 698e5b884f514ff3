"""A gateway node started with port 0 (or a wildcard host) advertises the address it really
listens on: it registers a reachable URL with its rollout server and gets work there. Before the
fix it registered ``http://127.0.0.1:0`` and every session stayed REGISTERED."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine
from polar.errors import ConfigError
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.gateway.listen import advertised_url, bind_gateway, check_advertised, routable_host
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig


def node_gateway(root: Path, rollout_url: str, **options: object) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "capture_db": root / "captures.db",
            "admin_token": "t" * 32,
            "node": NodeConfig(
                node_id="n0", work_dir=root / "sessions", rollout_url=rollout_url, heartbeat_s=0.1
            ),
            **options,
        }
    )


def test_a_port_0_node_registers_its_bound_reachable_url(tmp_path: Path) -> None:
    rollout = create_rollout_app(RolloutServerConfig(data_dir=tmp_path / "rollout", auth=False))
    with BackgroundServer(rollout) as server:
        config, sock = bind_gateway(node_gateway(tmp_path, server.url, port=0))
        assert config.port != 0 and config.port == sock.getsockname()[1]
        engine = ScriptedEngine(ScriptedBackend(Script()))
        app = create_app(config, engine=engine, store=CaptureStore(config.capture_db))
        with BackgroundServer(app, sock=sock) as gateway:
            deadline = time.monotonic() + 10
            nodes: list[dict[str, object]] = []
            while time.monotonic() < deadline and not nodes:
                nodes = httpx.get(f"{server.url}/nodes", timeout=5).json()
                time.sleep(0.05)
            assert [n["url"] for n in nodes] == [f"http://127.0.0.1:{gateway.port}"]
            assert httpx.get(f"{nodes[0]['url']}/health", timeout=5).status_code == 200


def test_a_wildcard_host_advertises_the_address_that_routes_to_the_rollout_server(
    tmp_path: Path,
) -> None:
    config = node_gateway(tmp_path, "http://127.0.0.1:8200", host="0.0.0.0", port=0)
    assert advertised_url(config, 4321) == "http://127.0.0.1:4321"
    assert routable_host("10.1.2.3", "http://127.0.0.1:1") == "10.1.2.3"
    assert routable_host("0.0.0.0") not in ("0.0.0.0", "")


def test_a_configured_public_url_wins(tmp_path: Path) -> None:
    config = node_gateway(tmp_path, "http://127.0.0.1:8200", public_url="http://gw.example:80/")
    assert advertised_url(config, 4321) == "http://gw.example:80"


@pytest.mark.parametrize("url", ["http://127.0.0.1:0", "http://0.0.0.0:8100"])
def test_a_node_refuses_to_advertise_an_unreachable_url(url: str) -> None:
    with pytest.raises(ConfigError, match="no one can reach"):
        check_advertised(url)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_unbound_port_0_node_fails_to_start_instead_of_idling(tmp_path: Path) -> None:
    config = node_gateway(tmp_path, "http://127.0.0.1:9", port=0)
    engine = ScriptedEngine(ScriptedBackend(Script()))
    app = create_app(config, engine=engine, store=CaptureStore(config.capture_db))
    with pytest.raises(RuntimeError, match="failed to start"):
        BackgroundServer(app).start(timeout_s=10)
