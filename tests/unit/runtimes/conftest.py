"""Fixtures for runtime tests: tiny real HTTP servers on the host's loopback, and a tiny real
git repository to seed workspaces from."""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every GET with its server's name and the path it saw."""

    def do_GET(self) -> None:
        body = f"{self.server.label} {self.path}".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serve(label: str) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.label = label  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def gateway_url() -> Iterator[str]:
    """A stand-in gateway: ``GET /gw/x`` answers ``gateway /gw/x``."""
    with _serve("gateway") as url:
        yield f"{url}/gw"


@pytest.fixture(scope="session")
def other_server_url() -> Iterator[str]:
    """Another host loopback service a sandbox must not reach."""
    with _serve("other") as url:
        yield url


# Fixed identities and dates: the same commits (and shas) on every run.
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "Polar Test",
    "GIT_AUTHOR_EMAIL": "test@polar.invalid",
    "GIT_COMMITTER_NAME": "Polar Test",
    "GIT_COMMITTER_EMAIL": "test@polar.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}


def git(cwd: Path, *args: str) -> str:
    """Run git in ``cwd`` with a clean configuration; its stdout, stripped."""
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class GitRepo:
    path: Path
    first: str
    """The first commit: app.py says VALUE = 1, with a link and an executable script."""
    second: str
    """HEAD of main: app.py says VALUE = 2, and notes.txt is added."""


@pytest.fixture
def git_repo(tmp_path: Path) -> GitRepo:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "app.py").write_text("VALUE = 1\n")
    (path / "run.sh").write_text("#!/bin/sh\necho run\n")
    (path / "run.sh").chmod(0o755)
    (path / "link.py").symlink_to("app.py")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "one")
    first = git(path, "rev-parse", "HEAD")
    (path / "app.py").write_text("VALUE = 2\n")
    (path / "notes.txt").write_text("later\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "two")
    return GitRepo(path, first, git(path, "rev-parse", "HEAD"))


@pytest.fixture(autouse=True)
def checkout_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own checkout cache, never the user's."""
    cache = tmp_path / "checkout-cache"
    monkeypatch.setenv("POLAR_CHECKOUT_CACHE", str(cache))
    return cache
