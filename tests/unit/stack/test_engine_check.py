"""``polar check-engine`` against the scripted engine on loopback: it passes a faithful engine
and names what differs on one whose chat rendering or prompt echo does not match."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from polar.cli.main import main
from polar.engines.scripted import Script, ScriptedBackend, ScriptedReply, create_scripted_app
from polar.gateway.server import BackgroundServer
from polar.rendering import call_patterns
from polar.rendering.families.registry import get_family
from polar.rendering.model_files import tokenizer_cache_path
from polar.rendering.tool_text import messages_for_plain_template
from polar.stack.engine_check import check_engine, format_report


def _backend(backend_class: type[ScriptedBackend] = ScriptedBackend) -> ScriptedBackend:
    """A backend that samples non-canonically: one tool call, then text answers."""
    backend = backend_class(Script(default=ScriptedReply(content="Done.")), noncanonical=True)
    backend.script.push(
        ScriptedReply(tool_calls=[("bash", {"command": "ls -la", "timeout": 5})]),
        ScriptedReply(content="Two files.", reasoning="The listing shows two."),
    )
    return backend


@pytest.fixture
def engine_url() -> Iterator[str]:
    with BackgroundServer(create_scripted_app(_backend())) as server:
        yield server.url


def test_a_faithful_engine_passes_with_every_count_exact(
    engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-engine", engine_url, "--sessions", "2", "--turns", "3"]) == 0
    out = capsys.readouterr().out
    assert "model    SmolLM2-135M-Instruct" in out
    assert "render   gateway" in out
    assert "FAIL" not in out
    assert out.rstrip().endswith("OK: every prompt, capture and merged context exact")


def test_the_json_report_counts_calls_tool_calls_and_merged_contexts(
    engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-engine", engine_url, "--sessions", "1", "--turns", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert [row["case"] for row in report["parity"]] == [
        "user only",
        "system + turns",
        "tools",
        "tool call + result",
        "reasoning, calls, user turns",
        "parallel calls + results",
    ]
    (session,) = report["sessions"]
    assert session["calls"] == 3
    assert session["tool_calls"] == 1
    assert session["exact_captures"] == 3
    assert session["merged_calls"] == 2 and session["exact_contexts"] == 2
    assert session["traces"] == 1


class _ToolBlindBackend(ScriptedBackend):
    """An engine started without a tool-aware chat template: its own rendering shows the
    model no tools (vLLM serving SmolLM2 without --chat-template does this)."""

    def prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        plain = messages_for_plain_template(messages, None)
        ids = self.tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
        return [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def test_an_engine_rendering_tools_differently_fails_parity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with BackgroundServer(create_scripted_app(_backend(_ToolBlindBackend))) as server:
        code = main(["check-engine", server.url, "--sessions", "1", "--turns", "2"])
    out = capsys.readouterr().out
    assert code == 1
    lines = {line[5:44].strip(): line for line in out.splitlines() if line[:4] in ("ok  ", "FAIL")}
    assert lines["user only"].startswith("ok")
    assert lines["tools"].startswith("FAIL") and "first difference at token" in lines["tools"]
    assert lines["tool call + result"].startswith("FAIL")
    assert out.rstrip().endswith("MISMATCH")


class _ShiftedEcho(httpx.AsyncBaseTransport):
    """An engine whose echoed prompt is not what it was sent (e.g. it added a BOS token)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/v1/completions"):
            return response
        body = json.loads(await response.aread())
        body["choices"][0]["prompt_token_ids"] = [1, *body["choices"][0]["prompt_token_ids"]]
        return httpx.Response(response.status_code, json=body, request=request)


async def test_an_engine_conditioning_on_other_ids_than_sent_fails_the_captures(
    engine_url: str,
) -> None:
    check = await check_engine(engine_url, sessions=1, turns=2, transport=_ShiftedEcho())
    assert all(row.ok for row in check.parity)
    (session,) = check.sessions
    assert session.calls == 2
    assert session.exact_captures == 0
    assert not check.ok


def test_an_unrecognised_tokenizer_stops_the_check_until_a_family_is_named(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|unheard_of|>"]})
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(str(tmp_path))
    args = ["check-engine", engine_url, "--tokenizer", str(tmp_path), "--turns", "2"]
    assert main([*args, "--sessions", "1"]) == 2
    assert "set render.family" in capsys.readouterr().err
    assert main([*args, "--sessions", "1", "--family", "smollm2"]) == 0
    assert "family   smollm2" in capsys.readouterr().out


def test_a_run_without_tool_calls_or_merged_calls_is_not_ok(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A model that only answers in text leaves the tool-call path unexercised: exact as far
    as it went, and still not OK (issue 37: 0 tool calls once printed 'OK')."""
    backend = ScriptedBackend(Script(default=ScriptedReply(content="Done.")), noncanonical=True)
    with BackgroundServer(create_scripted_app(backend)) as server:
        code = main(["check-engine", server.url, "--sessions", "1", "--turns", "2"])
    out = capsys.readouterr().out
    assert code == 1
    assert "not run  no tool call was made" in out
    assert "OK:" not in out
    assert out.rstrip().endswith(
        "INCOMPLETE: exact where exercised, but not everything was; try --force-tools"
    )
    with BackgroundServer(create_scripted_app(_backend())) as server:
        assert main(["check-engine", server.url, "--sessions", "1", "--turns", "1"]) == 1
    out = capsys.readouterr().out
    assert "not run  no call was merged onto an earlier one" in out


async def test_force_tools_makes_every_call_a_forced_one_spliced_onto_the_last() -> None:
    """--force-tools sends tool_choice required, then bash by name; the (strict, regex-checked)
    engine answers with calls, and every later call is merged onto the one before."""
    backend = ScriptedBackend(
        Script(default=ScriptedReply(tool_calls=[("bash", {"command": "ls"})])),
        noncanonical=True,
    )
    with BackgroundServer(create_scripted_app(backend)) as server:
        check = await check_engine(server.url, sessions=1, turns=3, force_tools=True)
    (session,) = check.sessions
    assert session.forced_calls == 3 and session.tool_calls == 3
    assert session.merged_calls == 2 and session.exact_contexts == 2
    forced = [b for b in backend.requests if isinstance(b.get("prompt"), list)]
    assert len(forced) == 3 and all(b["structured_outputs"]["regex"] for b in forced)
    assert check.ok, check


async def test_force_tools_on_a_family_with_no_call_pattern_says_so_and_is_not_ok(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A family whose call format no pattern can force (GLM-4.7's, Kimi K2's, gpt-oss's): the
    sessions run with tool_choice auto, exact as far as they go, and the verdict names what
    forcing did not exercise instead of failing on the gateway's refusal."""
    family = type(get_family("smollm2"))
    monkeypatch.setattr(family, "call_pattern", lambda self, tools, parallel: None)
    with BackgroundServer(create_scripted_app(_backend())) as server:
        check = await check_engine(server.url, sessions=1, turns=3, force_tools=True)
    (session,) = check.sessions
    assert session.error is None and session.forced_calls == 0 and session.ok, session
    assert check.unforceable is not None and "'smollm2'" in check.unforceable
    assert check.unexercised[0].startswith("forced tool calls were not sent")
    assert not check.ok
    report = format_report(check)
    assert "not run  forced tool calls were not sent" in report
    assert "try --force-tools" not in report


def test_an_engine_reasoning_parser_moves_the_forced_grammar_after_the_reasoning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Told the engine runs a reasoning parser (vLLM then applies a grammar only once the
    reasoning has ended), the forced calls' pattern is the one that starts there, and the report
    names the parser; the sessions are still checked in full."""
    sent: dict[str | None, list[str]] = {}
    for parser in (None, "qwen3"):
        backend = ScriptedBackend(
            Script(default=ScriptedReply(tool_calls=[("bash", {"command": "ls"})])),
            noncanonical=True,
        )
        args = ["--engine-reasoning-parser", parser] if parser else []
        with BackgroundServer(create_scripted_app(backend)) as server:
            code = main(["check-engine", server.url, "--sessions", "1", "--turns", "2",
                         "--force-tools", *args])  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0, out
        assert ("engine reasoning parser qwen3" in out) == (parser is not None), out
        sent[parser] = [
            b["structured_outputs"]["regex"]
            for b in backend.requests
            if isinstance(b.get("prompt"), list)
        ]
    assert len(sent[None]) == len(sent["qwen3"]) == 2
    assert sent["qwen3"] == [call_patterns.after_reasoning(r) for r in sent[None]]
    assert sent["qwen3"] != sent[None]
