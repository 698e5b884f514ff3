"""The verl agent-loop config entry's settings, without verl: what ``PolarVerlAgentLoop`` builds
from ``rollout_url``, ``task_factory`` and verl's rollout limits, and what it refuses."""

from __future__ import annotations

import pytest

from polar.training.bridges import verl as bridge


def test_a_config_entry_builds_one_loop_per_process_with_verl_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bridge, "_loops", {})
    settings = {
        "rollout_url": "http://rollout:8200",
        "task_factory": "polar.training.tasks:arithmetic",
        "timeout_s": 60.0,
    }
    loop = bridge._shared_loop(None, settings, 512, 1024)
    assert (loop.prompt_length, loop.response_length, loop.timeout_s) == (512, 1024, 60.0)
    assert bridge._shared_loop(None, dict(settings), 512, 1024) is loop  # verl builds per sample
    loop.client.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rollout_url": "http://rollout:8200"}, "needs rollout_url and task_factory"),
        ({"rollout_url": "http://r", "task_factory": "polar.training.tasks"}, "module:function"),
    ],
)
def test_an_incomplete_config_entry_is_refused(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bridge._shared_loop(None, settings, 512, 1024)


def test_an_unregistered_loop_name_is_refused() -> None:
    with pytest.raises(KeyError, match="no Polar agent loop registered as 'nope'"):
        bridge._shared_loop("nope", {}, 512, 1024)
