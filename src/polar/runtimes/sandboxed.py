"""What the isolating runtimes share: the gateway relay, and the capabilities it implies."""

from __future__ import annotations

from pathlib import Path

from polar.runtimes.base import Capabilities, Runtime
from polar.runtimes.gateway_relay import DEFAULT_PORT_INSIDE, GatewayRelay
from polar.schemas.task import RuntimeSpec


class SandboxedRuntime(Runtime):
    """A runtime with its own filesystem and processes; with ``network="gateway"`` its only
    way out is a relay to the gateway (``options.gateway_port`` is the port inside)."""

    def __init__(self, spec: RuntimeSpec, session_dir: Path, gateway_url: str) -> None:
        super().__init__(spec, session_dir, gateway_url)
        port = int(self.spec.options.get("gateway_port", DEFAULT_PORT_INSIDE))
        self.relay = (
            GatewayRelay(gateway_url, self.run_path, port_inside=port)
            if self.spec.network == "gateway"
            else None
        )

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            filesystem_isolation=True,
            network_isolation=self.relay is not None,
            process_isolation=True,
            resource_limits=self.requested_limits,
        )

    @property
    def gateway_url_inside(self) -> str:
        return self.relay.url_inside if self.relay else self.gateway_url

    def forwarder_python_option(self) -> list[str]:
        """The interpreter (inside an image) that runs the gateway forwarder."""
        default = ["python3", "-I", "-S"]
        return [str(arg) for arg in self.spec.options.get("forwarder_python", default)]
