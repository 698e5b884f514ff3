"""One registry type for every pluggable component (providers, engines, builders, ...).

Components are looked up by short name or by ``module:Class`` import path, so users add their
own without touching Polar.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from polar.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to classes (or factories); also resolves ``module:Class`` paths."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator form: ``@registry.register("name")``."""

        def add(item: Callable[..., T]) -> Callable[..., T]:
            self.add(name, item)
            return item

        return add

    def add(self, name: str, item: Callable[..., T]) -> None:
        self._items[name] = item

    def remove(self, name: str) -> None:
        """Forget ``name`` (a component registered at runtime, e.g. by a test)."""
        self._items.pop(name, None)

    def get(self, name: str) -> Callable[..., T]:
        """The class for ``name``; an import path ``pkg.module:Class`` is imported on demand."""
        if name in self._items:
            return self._items[name]
        if ":" in name:
            module_name, _, attr = name.partition(":")
            try:
                module = importlib.import_module(module_name)
                return getattr(module, attr)
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"cannot import {self.kind} {name!r}: {exc}") from exc
        known = ", ".join(sorted(self._items)) or "none"
        raise ConfigError(f"unknown {self.kind} {name!r} (known: {known}; or use module:Class)")

    def create(self, name: str, *args: object, **kwargs: object) -> T:
        return self.get(name)(*args, **kwargs)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
