"""``polar submit`` / ``polar status`` against a real rollout server on loopback."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.cli import rollout as cli
from polar.client import RolloutError
from polar.errors import ConfigError
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    return parser.parse_args(argv)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BackgroundServer]:
    config = RolloutServerConfig(
        data_dir=tmp_path / "data", admin_token="tok", default_runtime="local"
    )
    with BackgroundServer(create_rollout_app(config)) as s:
        yield s


def test_submit_then_status(server: BackgroundServer, tmp_path: Path, capsys) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("task_id: demo\ninstruction: say hi\nnum_samples: 3\n")
    url = server.url
    args = parse("submit", str(task), "--url", url, "--token", "tok")
    assert args.func(args) == 0
    assert "submitted demo: 3 sessions" in capsys.readouterr().out
    args = parse("status", "demo", "--url", url, "--token", "tok")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "registered=3" in out
    service = server.server.config.app.state.service
    assert service._request("demo").runtime.kind == "local"  # unset kind: topology default


def test_errors_are_clear(server: BackgroundServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("task_id: x\ninstruction: y\nnum_sample: 2\n")
    with pytest.raises(ConfigError, match="num_sample"):
        cli.load_task(bad)
    good = tmp_path / "good.yaml"
    good.write_text("task_id: x\ninstruction: y\n")
    args = parse("submit", str(good), "--url", server.url)
    with pytest.raises(RolloutError, match="HTTP 401"):
        args.func(args)
    args = parse("status", "--url", "http://127.0.0.1:9")
    with pytest.raises(RolloutError, match="cannot reach"):
        args.func(args)


def test_generated_tokens_pass_as_a_cli_value_after_their_option() -> None:
    """A token starting with ``-`` would read as a missing ``--token`` value."""
    from polar.tokens import new_token

    for _ in range(200):
        token = new_token()
        assert not token.startswith("-") and len(token) == 64
        assert parse("status", "--token", token).token == token
