"""The provider adapters, and detection: path first, then headers, then body shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polar.errors import ConfigError
from polar.providers.anthropic import AnthropicProvider
from polar.providers.base import Provider, RequestContext
from polar.providers.google import GoogleProvider
from polar.providers.google_interactions import GoogleInteractionsProvider
from polar.providers.openai_chat import OpenAIChatProvider
from polar.providers.openai_responses import OpenAIResponsesProvider
from polar.providers.routing import ProviderRouting, RoutingTable
from polar.registry import Registry

PROVIDERS: Registry[Provider] = Registry("provider")
PROVIDERS.add("anthropic", AnthropicProvider)
PROVIDERS.add("openai_chat", OpenAIChatProvider)
PROVIDERS.add("openai_responses", OpenAIResponsesProvider)
PROVIDERS.add("google", GoogleProvider)
PROVIDERS.add("google_interactions", GoogleInteractionsProvider)

# Body-shape detection order: the most specific shapes first; providers added later go
# before openai_chat, whose shape (a ``messages`` list) is the loosest.
_BODY_FIRST = ("openai_responses", "google", "anthropic")
_BODY_LAST = ("openai_chat",)


def routing_table() -> RoutingTable:
    """The routing facts of every registered provider, read when asked (so a provider added
    at runtime is served at once)."""
    return RoutingTable(routing_of(name) for name in PROVIDERS)


def routing_of(name: str) -> ProviderRouting:
    routing = getattr(PROVIDERS.get(name), "routing", None)
    if not isinstance(routing, ProviderRouting):
        raise ConfigError(f"provider {name!r} declares no routing (a ProviderRouting)")
    return routing


class ProviderSet:
    """Instantiated adapters with the detection rules over them."""

    def __init__(self) -> None:
        self.by_name: dict[str, Provider] = {name: PROVIDERS.create(name) for name in PROVIDERS}

    def by_path(self, ctx: RequestContext) -> tuple[Provider, str] | None:
        for provider in self.by_name.values():
            op = provider.operation(ctx)
            if op is not None:
                return provider, op
        return None

    def by_headers(self, ctx: RequestContext) -> Provider | None:
        for provider in self.by_name.values():
            if provider.matches_headers(ctx.headers):
                return provider
        return None

    def by_body(self, body: Any) -> Provider | None:
        added = [name for name in self.by_name if name not in _BODY_FIRST + _BODY_LAST]
        for name in (*_BODY_FIRST, *added, *_BODY_LAST):
            provider = self.by_name.get(name)
            if provider is not None and provider.matches_body(body):
                return provider
        return None

    def fallback(self, ctx: RequestContext, body_of: Callable[[], Any]) -> Provider | None:
        """Headers, then body shape, for paths no adapter claims."""
        return self.by_headers(ctx) or self.by_body(body_of())
