"""What the isolating runtimes share: the gateway relay, and the capabilities it implies."""

from __future__ import annotations

from pydantic import Field

from polar.runtimes.base import Capabilities, Runtime, RuntimeOptions
from polar.runtimes.gateway_relay import DEFAULT_PORT_INSIDE, GatewayRelay


class SandboxedOptions(RuntimeOptions):
    gateway_port: int = Field(
        DEFAULT_PORT_INSIDE, gt=0, lt=65536, description="The gateway's loopback port inside."
    )


class ImageOptions(SandboxedOptions):
    """Options of the runtimes that run an image, where the gateway forwarder needs a Python."""

    forwarder_python: list[str] = Field(
        default_factory=lambda: ["python3", "-I", "-S"],
        description="The interpreter (inside the image) that runs the gateway forwarder.",
    )


class SandboxedRuntime(Runtime):
    """A runtime with its own filesystem and processes; with ``network="gateway"`` its only
    way out is a relay to the gateway (``options.gateway_port`` is the port inside), which
    serves ``model_api`` (the session's model-API view) when one is given."""

    options_model = SandboxedOptions
    options: SandboxedOptions

    def _configure(self) -> None:
        super()._configure()
        self.relay = (
            GatewayRelay(
                self.gateway_url,
                self.run_path,
                port_inside=self.options.gateway_port,
                model_api=self.model_api,
            )
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

    def _base_env(self) -> dict[str, str]:
        # The workspace's files belong to whoever made them on the host (or to the container's
        # user): git inside must still trust a checkout there instead of refusing it for
        # "dubious ownership". Only configuration from the environment or a global file
        # counts for that, never the repository's own .git/config.
        return {
            **super()._base_env(),
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
        }
