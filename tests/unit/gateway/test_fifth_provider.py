"""A fifth provider is one module plus one registry line: registered at runtime here, the
gateway serves it, the sandbox's model-API view admits its routes and key header, and the
environment every harness gets points its SDK at the session."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.errors import GatewayError
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.model_api_view import ModelApiView
from polar.gateway.node.session_work import session_env
from polar.gateway.services import app_services
from polar.harnesses.base import HarnessContext
from polar.providers.base import GENERATE, Provider, RequestContext, require_dict, sse
from polar.providers.registry import PROVIDERS, routing_table
from polar.providers.routing import ProviderRouting
from polar.providers.types import Completion, NormalizedRequest


class ToyProvider(Provider):
    """A made-up wire API: ``POST /toy/complete {"prompt": ...}`` -> ``{"text": ...}``."""

    name: ClassVar[str] = "toy"
    routing: ClassVar[ProviderRouting] = ProviderRouting(
        client="toy",
        api_roots=("/toy",),
        base_url_suffix="/toy",
        key_headers=("x-toy-key",),
        base_url_env=("TOY_BASE_URL",),
        api_key_env=("TOY_API_KEY",),
    )

    def operation(self, ctx: RequestContext) -> str | None:
        return GENERATE if ctx.path.rstrip("/").endswith("/toy/complete") else None

    def matches_headers(self, headers: Mapping[str, str]) -> bool:
        return "x-toy-key" in headers

    def parse_request(self, body: Any, ctx: RequestContext) -> NormalizedRequest:
        prompt = require_dict(body).get("prompt", "")
        messages = [{"role": "user", "content": str(prompt)}]
        return NormalizedRequest(provider=self.name, model="toy", messages=messages)

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        return {"text": completion.content}

    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        return [sse({"text": completion.content})]

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return {"toy_error": error.message}

    def stream_error(self, error: GatewayError) -> bytes:
        return sse({"toy_error": error.message})


@pytest.fixture
def toy() -> Iterator[None]:
    PROVIDERS.add("toy", ToyProvider)  # the one registry line
    yield
    PROVIDERS.remove("toy")


@pytest.fixture
def gateway(toy: None, tmp_path: Path, tokenizer: Any) -> tuple[Any, Script]:
    script = Script()
    config = GatewayConfig(capture_db=tmp_path / "c.db", served_model="SmolLM2-135M-Instruct")
    engine = ScriptedEngine(ScriptedBackend(script, tokenizer=tokenizer))
    return create_app(config, engine=engine, store=CaptureStore(config.capture_db)), script


async def _session(app: Any) -> dict[str, Any]:
    admin = {"authorization": f"Bearer {app_services(app).admin_token}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        reply = await client.post("/polar/sessions", json={}, headers=admin)
    reply.raise_for_status()
    return dict(reply.json())


async def test_the_gateway_serves_the_fifth_provider_by_its_routing_facts(
    gateway: tuple[Any, Script],
) -> None:
    app, script = gateway
    session = await _session(app)
    key = session["api_key"]
    toy_url = session["base_urls"]["toy"]
    assert toy_url.endswith(f"/s/{key}/toy")
    script.push(ScriptedReply(content="hello from toy"), ScriptedReply(content="again"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport) as client:
        reply = await client.post(toy_url + "/complete", json={"prompt": "hi"}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"text": "hello from toy"}
        # Without the session prefix, its own key header names the session.
        root = toy_url.removesuffix(f"/s/{key}/toy")
        by_header = await client.post(
            f"{root}/toy/complete", json={}, headers={"x-toy-key": key}, timeout=30
        )
    assert by_header.status_code == 200 and by_header.json() == {"text": "again"}
    assert [r.provider for r in app_services(app).store.records(key)] == ["toy", "toy"]


async def test_the_sandbox_view_admits_its_routes_and_its_key_header_only(
    gateway: tuple[Any, Script],
) -> None:
    app, script = gateway
    key = (await _session(app))["api_key"]
    script.push(ScriptedReply(content="inside"))
    view = httpx.ASGITransport(app=ModelApiView(app, key))
    async with httpx.AsyncClient(transport=view, base_url="http://sandbox") as client:
        served = await client.post("/toy/complete", json={"prompt": "hi"}, timeout=30)
        other_key = await client.post("/toy/complete", json={}, headers={"x-toy-key": "ps-x"})
    assert served.status_code == 200 and served.json() == {"text": "inside"}
    assert other_key.status_code == 403


def test_every_harness_gets_its_sdk_environment_and_base_url(toy: None) -> None:
    class Inside:
        gateway_url_inside = "http://gw.inside"
        home = "/home/agent"

    env = session_env(Inside(), "ps-k", "task-1")  # type: ignore[arg-type]
    assert env["TOY_BASE_URL"] == "http://gw.inside/s/ps-k/toy"
    assert env["TOY_API_KEY"] == "ps-k"
    assert env["OPENAI_BASE_URL"] == "http://gw.inside/s/ps-k/v1"
    ctx = HarnessContext("ps-k", "http://gw.inside", "m", "do it", "/w", "/home/agent", "/p")
    assert ctx.base_url("toy") == "http://gw.inside/s/ps-k/toy"
    assert "/toy" in routing_table().api_roots and "x-toy-key" in routing_table().key_headers


def test_without_the_registry_line_nothing_routes_to_it() -> None:
    assert "/toy" not in routing_table().api_roots
    assert "toy" not in routing_table().base_urls("http://gw/s/k")
