"""A node id with a credential on record registers again only with that credential or the admin
token, through HTTP against a real server: after the server restarts (the credential record is
durable in its store) and after the node was declared dead, the enrolment secret no longer takes
a live node's id over (before, it did: the real node's sessions failed, its credential was
revoked, the impostor got its future sessions). It enrols new ids only, and an operator retires
an id with ``DELETE /nodes/{id}``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.schemas.node import NodeReport, NodeStatus, Workers

ENROL = "enrol-secret"


@contextmanager
def rollout_server(data_dir: Path) -> Iterator[tuple[str, str]]:
    """A real rollout server on ``data_dir`` (the same dir again: a restart); (url, admin)."""
    app = create_rollout_app(RolloutServerConfig(data_dir=data_dir, enrolment_secret=ENROL))
    with BackgroundServer(app) as server:
        yield server.url, app.state.service.access.admin_token
    app.state.service.store.close()


def report(node_id: str) -> str:
    workers = Workers(init=1, run=1, postrun=1, ready_buffer=1, queue_limit=4)
    status = NodeStatus(node_id=node_id, url="http://127.0.0.1:9", workers=workers)
    return NodeReport(status=status).model_dump_json()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "content-type": "application/json"}


def register(url: str, node_id: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{url}/nodes/register", content=report(node_id), headers=bearer(token), timeout=10
    )


def test_after_a_server_restart_the_enrolment_secret_cannot_take_a_known_id(
    tmp_path: Path,
) -> None:
    with rollout_server(tmp_path) as (url, _):
        credential = register(url, "a", ENROL).json()["credential"]
    with rollout_server(tmp_path) as (url, _):
        taken = register(url, "a", ENROL)
        assert taken.status_code == 403, taken.text
        assert "credential on record" in taken.json()["detail"]
        assert register(url, "new", ENROL).status_code == 200  # new ids still enrol
        again = register(url, "a", credential)
        assert again.status_code == 200 and again.json()["credential"] == credential
        heartbeat = httpx.post(
            f"{url}/nodes/a/heartbeat", content=report("a"), headers=bearer(credential), timeout=10
        )
        assert heartbeat.status_code == 200, heartbeat.text


def test_after_a_node_was_declared_dead_only_its_credential_or_the_admin_token_register_it(
    tmp_path: Path,
) -> None:
    with rollout_server(tmp_path) as (url, admin):
        credential = register(url, "a", ENROL).json()["credential"]
        lost = httpx.post(f"{url}/nodes/a/lost", json={}, headers=bearer(admin), timeout=10)
        assert lost.status_code == 200, lost.text
        assert register(url, "a", ENROL).status_code == 403
        assert register(url, "a", credential).status_code == 200
        # The admin token may register a known id that is not live (a new credential: the
        # old one stops working).
        httpx.post(f"{url}/nodes/a/lost", json={}, headers=bearer(admin), timeout=10)
        reissued = register(url, "a", admin)
        assert reissued.status_code == 200
        assert reissued.json()["credential"] != credential
        assert register(url, "a", credential).status_code == 401


def test_an_operator_retires_an_id_so_it_may_enrol_anew(tmp_path: Path) -> None:
    with rollout_server(tmp_path) as (url, admin):
        credential = register(url, "a", ENROL).json()["credential"]
        live = httpx.delete(f"{url}/nodes/a", headers=bearer(admin), timeout=10)
        assert live.status_code == 409, live.text
    with rollout_server(tmp_path) as (url, admin):
        for token in (ENROL, credential):
            refused = httpx.delete(f"{url}/nodes/a", headers=bearer(token), timeout=10)
            assert refused.status_code == 401
        assert httpx.delete(f"{url}/nodes/a", headers=bearer(admin), timeout=10).status_code == 204
        assert httpx.delete(f"{url}/nodes/a", headers=bearer(admin), timeout=10).status_code == 404
        assert register(url, "a", credential).status_code == 401  # revoked
        assert register(url, "a", ENROL).status_code == 200


async def test_a_ray_replacement_gateway_without_its_credential_file_enrols_again(
    tmp_path: Path,
) -> None:
    """A gateway gone past its restarts is replaced on its node under the same id. The fresh
    one normally finds the credential its predecessor kept in the work dir; if it lands
    without it (the predecessor died before writing it, the dir was wiped), the enrolment
    secret alone was refused (403: a credential on record) and the node had no gateway for
    good. The provider, in the rollout server, revokes the credential before replacing."""
    from polar.ray.actors import GatewaySpec, gateway_node_id
    from polar.ray.config import RaySection
    from polar.ray.provider import RayNodeProvider

    ray_node = "a" * 28
    node_id = gateway_node_id(ray_node)

    class Cluster:
        actors = {ray_node}

        def nodes(self) -> list[dict[str, object]]:
            return [{"NodeID": ray_node, "Alive": True, "Resources": {"polar_gateway": 1.0}}]

        def existing(self) -> set[str]:
            return set(self.actors)

        def gateway_names(self) -> set[str]:
            return {f"polar-gw-{n[:12]}" for n in self.actors}

        def place(self, node: str, spec: GatewaySpec) -> None:
            self.actors.add(node)

        def remove(self, node: str) -> None:
            self.actors.discard(node)

    app = create_rollout_app(RolloutServerConfig(data_dir=tmp_path, enrolment_secret=ENROL))
    with BackgroundServer(app) as server:
        service = app.state.service
        assert register(server.url, node_id, ENROL).status_code == 200  # the first gateway
        section = RaySection.model_validate({"address": "auto"})
        spec = GatewaySpec(
            gateways=section.gateways, rollout_url=server.url, enrolment_secret=ENROL
        )
        cluster = Cluster()
        provider = RayNodeProvider(section, spec, state_dir=tmp_path / "ray", cluster=cluster)  # type: ignore[arg-type]
        provider.placed = {ray_node}
        provider.host = service
        cluster.actors = set()  # it died past its restarts; its node lives on
        for _ in range(3):  # gone for good after two rounds, replaced on the next
            await provider.reconcile()
        assert cluster.actors == {ray_node}
        # The replacement, with no credential file, enrols with the enrolment secret.
        again = register(server.url, node_id, ENROL)
        assert again.status_code == 200, again.text
    service.store.close()
