"""The network edge's limits derived from the process's descriptor limit."""

from __future__ import annotations

import subprocess
import sys

from polar.serving import ServerLimits, accept_burst, connection_cap


def test_the_connection_cap_leaves_the_reserve_and_an_engine_connection_per_call() -> None:
    limits = ServerLimits()
    assert connection_cap(limits, 1024) == (1024 - 128) // 2  # 448: ulimit -n 1024
    assert connection_cap(limits, 1 << 20) == 1024  # the configured cap where fds are many
    assert connection_cap(limits, 100) == 1  # never none
    cap = connection_cap(limits, 1024)
    assert 2 * cap + accept_burst(limits, 1024, cap) <= 1024 - 64  # a burst fits the reserve
    assert accept_burst(limits, 1 << 20, 1024) == limits.backlog


def test_starting_a_server_raises_the_soft_descriptor_limit_to_the_hard_one() -> None:
    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048))\n"
        "from polar.serving import ServerLimits, uvicorn_settings\n"
        "settings = uvicorn_settings(ServerLimits())\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], settings['http'].max_connections)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2048", "960"]
