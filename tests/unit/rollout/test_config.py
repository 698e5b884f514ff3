"""Topology YAML: strict keys with clear messages, and per-node gateway configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.delivery import RetryPolicy
from polar.errors import ConfigError
from polar.stack.topology import Topology

TOPOLOGY = """
rollout:
  port: 8300
  admin_token: secret
  node_grace_s: 12
nodes:
  - id: gpu-a
    port: 8101
    engine: {kind: scripted}
    served_model: SmolLM2
    workers: {init: 3, run: 5, postrun: 2, ready_buffer: 6}
  - id: gpu-b
    port: 8102
defaults:
  runtime: local
"""


def test_reads_a_topology_and_derives_node_gateway_configs(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY)
    topology = Topology.from_yaml(path)
    assert topology.rollout.node_grace_s == 12
    gw = topology.gateway_config("gpu-a")
    assert (gw.port, gw.engine.kind, gw.served_model) == (8101, "scripted", "SmolLM2")
    assert gw.node is not None
    assert (gw.node.init_workers, gw.node.run_workers, gw.node.postrun_workers) == (3, 5, 2)
    assert gw.node.ready_buffer == 6
    assert gw.node.rollout_url == "http://127.0.0.1:8300"
    assert gw.node.rollout_token == "secret"
    assert gw.capture_db == Path("polar-node-gpu-a/captures.db")
    assert topology.gateway_config("gpu-b").node.run_workers == 4  # type: ignore[union-attr]


def test_unknown_key_names_its_place_and_the_allowed_keys() -> None:
    data = {"nodes": [{"id": "a", "workers": {"run_worker": 3}}]}
    with pytest.raises(ConfigError) as err:
        Topology.parse(data, source="t.yaml")
    message = str(err.value)
    assert "t.yaml" in message
    assert "nodes.0.workers.run_worker: unknown key" in message
    assert "allowed here: init, run, postrun, ready_buffer, queue_limit" in message


def test_unknown_top_level_and_engine_keys() -> None:
    with pytest.raises(ConfigError, match=r"rolout: unknown key \(allowed here: rollout, nodes"):
        Topology.parse({"rolout": {}})
    with pytest.raises(ConfigError, match=r"nodes\.0\.engine\.urll: unknown key"):
        Topology.parse({"nodes": [{"id": "a", "engine": {"urll": "x"}}]})


def test_bad_values_and_duplicate_ids_are_errors() -> None:
    with pytest.raises(ConfigError, match=r"nodes\.0\.workers\.run: Input should be greater"):
        Topology.parse({"nodes": [{"id": "a", "workers": {"run": 0}}]})
    with pytest.raises(ConfigError, match="duplicate node id"):
        Topology.parse({"nodes": [{"id": "a"}, {"id": "a"}]})
    with pytest.raises(ConfigError, match="no node 'zz'"):
        Topology.parse({}).gateway_config("zz")


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read topology"):
        Topology.from_yaml(tmp_path / "missing.yaml")


def test_retry_delay_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(initial_s=0.5, max_s=3)
    assert [policy.delay(i) for i in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
