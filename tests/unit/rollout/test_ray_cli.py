"""``polar ray up`` in the foreground: whatever ends it (Ctrl-C, SIGTERM, SIGHUP, an error)
takes Polar down once, and a second stop signal cannot cut the teardown short. No Ray here:
the teardown is a recorder (tests/integration/test_ray_cluster.py runs the real command)."""

from __future__ import annotations

import os
import signal

import pytest

from polar.cli.main import build_parser
from polar.cli.ray import STOP_SIGNALS, until_signalled


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_ends_the_block_and_tears_down_once(sig: int) -> None:
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    torn: list[str] = []
    reached_end = False

    def teardown() -> list[str]:
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C during the teardown is ignored
        torn.append("down")
        return ["polar-rollout"]

    with until_signalled(teardown):
        os.kill(os.getpid(), sig)
        signal.pause()  # not reached when the handler raised at once; returns otherwise
        reached_end = True
    assert torn == ["down"] and not reached_end
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before  # handlers given back


def test_an_error_tears_down_too_and_is_not_swallowed() -> None:
    torn: list[str] = []

    def teardown() -> list[str]:
        torn.append("down")
        return []

    with pytest.raises(RuntimeError, match="2 of 3 gateways"), until_signalled(teardown):
        raise RuntimeError("2 of 3 gateways up after 5s")
    assert torn == ["down"]


def test_wait_nodes_takes_a_deadline() -> None:
    args = build_parser().parse_args(["ray", "up", "--wait-nodes", "3", "--wait-timeout", "900"])
    assert (args.wait_nodes, args.wait_timeout) == (3, 900.0)
    assert build_parser().parse_args(["ray", "up"]).wait_timeout == 60.0
