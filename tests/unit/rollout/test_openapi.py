"""Property-based conformance of the rollout server's and the node's OpenAPI schemas
(schemathesis): no 5xx, documented status codes and content, responses match their schema.

Both apps run in-process without their lifespan, so nothing is dispatched or executed: the
node accepts generated sessions into its queue, but no worker ever starts their runtimes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.gateway.services import app_services
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.rollout.service import RolloutService

SETTINGS = settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def rollout_schema(tmp_path_factory: pytest.TempPathFactory) -> Any:
    data = tmp_path_factory.mktemp("rollout-api")
    config = RolloutServerConfig(data_dir=data, auth=False)  # auth: test_auth.py
    # Generated nodes register random URLs: calls to them (a drain) must never leave the
    # process (a DNS lookup of a random name can hang for seconds).
    offline = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(503)))
    app = create_rollout_app(config, service=RolloutService(config, client=offline))
    return schemathesis.openapi.from_asgi("/openapi.json", app).exclude(path="/events")


@pytest.fixture(scope="module")
def node_schema(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Any:
    root: Path = tmp_path_factory.mktemp("node-api")
    config = GatewayConfig(
        capture_db=root / "captures.db",
        auth=False,
        node=NodeConfig(node_id="n", work_dir=root / "sessions"),
    )
    engine = ScriptedEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    app = create_app(config, engine=engine)
    assert app_services(app).node.lifecycle._workers == []  # nothing will run
    return schemathesis.openapi.from_asgi("/openapi.json", app).include(path_regex="^/polar/node")


# Trace and Trajectory check cross-field rules (loss_mask as long as response_ids) that JSON
# Schema cannot state: schema-valid bodies that break them are rightly refused with 422. A
# task's callback_url must name a host of the server's allow-list (its config, not the schema).
# A node URL's bracketed host must be a real IPv6 address, which the pattern only approximates.
LENIENT = {
    "POST /results": [positive_data_acceptance],
    "POST /tasks": [positive_data_acceptance],
    "POST /nodes/register": [positive_data_acceptance],
    "POST /nodes/{node_id}/heartbeat": [positive_data_acceptance],
}


def conforms(schema: Any) -> list[str]:
    """Run every operation's generated cases; the labels of the operations checked."""
    checked = []
    for result in schema.get_all_operations():
        operation = result.ok()
        check_operation(operation, LENIENT.get(operation.label))
        checked.append(operation.label)
    return checked


def check_operation(operation: Any, excluded: list[Any] | None) -> None:
    @given(case=operation.as_strategy())
    @SETTINGS
    def check(case: Any) -> None:
        case.call_and_validate(excluded_checks=excluded)

    check()


def test_rollout_server_conforms(rollout_schema: Any) -> None:
    checked = conforms(rollout_schema)
    assert "POST /tasks" in checked and "POST /results" in checked


def test_node_api_conforms(node_schema: Any) -> None:
    checked = conforms(node_schema)
    assert "POST /polar/node/sessions" in checked
