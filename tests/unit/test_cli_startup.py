"""The ``polar`` command starts light: a gateway or rollout server process must not carry torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_does_not_import_torch_transformers_or_ray() -> None:
    probe = (
        "import sys, polar.cli.main as m; m.build_parser(); "
        "print(sorted(n for n in ('torch', 'transformers', 'trl', 'ray') if n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_embedded_package_still_exports_its_names() -> None:
    import polar.engines.embedded as embedded
    from polar.engines.embedded.core import EmbeddedEngineCore

    assert embedded.EmbeddedEngineCore is EmbeddedEngineCore
    assert all(getattr(embedded, name) is not None for name in embedded.__all__)
