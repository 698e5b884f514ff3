"""Clients of the rollout server: :class:`AsyncRolloutClient` and its blocking face
:class:`RolloutClient`. They depend on ``polar.schemas`` only, never on the server."""

from polar.client.async_client import AsyncRolloutClient, RolloutError, RolloutTimeout
from polar.client.sync_client import RolloutClient

__all__ = ["AsyncRolloutClient", "RolloutClient", "RolloutError", "RolloutTimeout"]
