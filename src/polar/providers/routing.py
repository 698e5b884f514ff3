"""How a wire API's clients reach the gateway, declared by the provider that serves it.

The gateway's key lookup, the sandbox's model-API view, the base URLs handed to clients and the
SDK environment every harness gets all read these facts, so a new provider is one module (its
``routing``) and one registry line, not an edit in each of those places.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProviderRouting:
    """One provider's routing facts (paths are after the ``/s/<key>`` session prefix)."""

    client: str
    """The base-URL name its SDK is handed under; adapters sharing one SDK share it
    (``openai`` for chat completions and responses)."""
    api_roots: tuple[str, ...]
    """The path roots its routes live under. The first one also takes a POST to itself, for
    clients that post to the bare versioned base URL (the gateway detects the API then)."""
    base_url_suffix: str = ""
    """What the SDK's base URL adds to the session URL (``/v1`` for OpenAI SDKs, which append
    only the resource path)."""
    key_headers: tuple[str, ...] = ()
    """Lower-case headers the SDK sends its key in, besides ``Authorization: Bearer``."""
    base_url_env: tuple[str, ...] = ()
    """Environment names the SDK reads its base URL from."""
    api_key_env: tuple[str, ...] = ()
    """Environment names the SDK reads its API key from."""


class RoutingTable:
    """The union of the registered providers' facts: what the gateway and the sandbox serve."""

    def __init__(self, entries: Iterable[ProviderRouting]) -> None:
        self.entries = tuple(entries)

    @property
    def api_roots(self) -> tuple[str, ...]:
        return _unique(root for entry in self.entries for root in entry.api_roots)

    @property
    def bare_paths(self) -> frozenset[str]:
        """Paths where a POST is body-detected: the base URL and each API's first root."""
        firsts = [entry.api_roots[0] for entry in self.entries if entry.api_roots]
        return frozenset({"", "/", *firsts, *(root + "/" for root in firsts)})

    @property
    def key_headers(self) -> tuple[str, ...]:
        return _unique(name for entry in self.entries for name in entry.key_headers)

    def base_urls(self, session_url: str) -> dict[str, str]:
        """Each client's base URL for the session at ``session_url``, as its SDK expects it."""
        return {entry.client: session_url + entry.base_url_suffix for entry in self.entries}

    def sdk_env(self, session_url: str, api_key: str) -> dict[str, str]:
        """The SDK environment pointing every provider's clients at ``session_url``."""
        env: dict[str, str] = {}
        for entry in self.entries:
            env.update(dict.fromkeys(entry.base_url_env, session_url + entry.base_url_suffix))
            env.update(dict.fromkeys(entry.api_key_env, api_key))
        return env


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
