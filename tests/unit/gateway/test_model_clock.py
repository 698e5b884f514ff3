"""A session's model-call clock: the seconds the gateway held at least one of its calls,
which a task with ``timeout_counts_model_time: false`` does not count against its budget."""

from __future__ import annotations

import pytest

from polar.gateway import sessions
from polar.gateway.sessions import GatewaySession


def test_the_clock_counts_time_with_a_call_open_once_however_many_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(sessions.time, "monotonic", lambda: now[0])
    session = GatewaySession("ps-a")
    assert session.model_seconds() == 0.0
    session.call_opened()
    now[0] = 102.0
    assert session.model_seconds() == 2.0  # a call still open counts up to now
    session.call_opened()  # a second call (a subagent's) overlapping the first
    now[0] = 103.0
    session.call_closed()
    now[0] = 104.0
    session.call_closed()
    assert session.model_seconds() == 4.0
    now[0] = 110.0  # the harness's own time: not counted
    assert session.model_seconds() == 4.0
    session.call_opened()
    now[0] = 111.5
    session.call_closed()
    assert session.model_seconds() == 5.5
