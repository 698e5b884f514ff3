"""The provider adapters, and detection: path first, then headers, then body shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polar.providers.anthropic import AnthropicProvider
from polar.providers.base import Provider, RequestContext
from polar.providers.google import GoogleProvider
from polar.providers.openai_chat import OpenAIChatProvider
from polar.providers.openai_responses import OpenAIResponsesProvider
from polar.registry import Registry

PROVIDERS: Registry[Provider] = Registry("provider")
PROVIDERS.add("anthropic", AnthropicProvider)
PROVIDERS.add("openai_chat", OpenAIChatProvider)
PROVIDERS.add("openai_responses", OpenAIResponsesProvider)
PROVIDERS.add("google", GoogleProvider)

# Body-shape detection order: the most specific shapes first.
_BODY_ORDER = ("openai_responses", "google", "anthropic", "openai_chat")


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
        for name in _BODY_ORDER:
            if self.by_name[name].matches_body(body):
                return self.by_name[name]
        return None

    def fallback(self, ctx: RequestContext, body_of: Callable[[], Any]) -> Provider | None:
        """Headers, then body shape, for paths no adapter claims."""
        return self.by_headers(ctx) or self.by_body(body_of())
