"""``polar``'s public API: every name in ``__all__`` is the owning module's own object, and
``import polar`` loads none of them (each loads on first use)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import polar


def test_all_names_each_public_name_once() -> None:
    assert sorted(polar.__all__) == sorted(["__version__", *polar._HOMES])
    assert len(set(polar.__all__)) == len(polar.__all__)


def test_import_polar_loads_no_subpackage() -> None:
    probe = "import sys, polar; print(sorted(m for m in sys.modules if m.startswith('polar.')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", [n for n in polar.__all__ if n != "__version__"])
def test_each_public_name_is_its_owners(name: str) -> None:
    home = importlib.import_module(polar._HOMES[name])
    assert getattr(polar, name) is getattr(home, name)
    assert name in dir(polar)


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = polar.Nope  # type: ignore[attr-defined]
    from polar import tokens

    assert tokens.__name__ == "polar.tokens"
