"""The gateway picks the served model's family at start, says so, and never guesses one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from artifacts import llama_cpp_template, qwen_tokenizer  # tests/artifacts.py
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.errors import ConfigError
from polar.gateway.config import GatewayConfig
from polar.gateway.engine_facts import discover
from polar.rendering.model_files import load_tokenizer


def engine(tokenizer: Any) -> ScriptedEngine:
    backend = ScriptedBackend(Script(default=ScriptedReply(content="ok")), tokenizer=tokenizer)
    return ScriptedEngine(backend)


def config(tmp_path: Path, **render: Any) -> GatewayConfig:
    return GatewayConfig(capture_db=tmp_path / "c.db", render=render)


def unknown_tokenizer() -> Any:
    """Qwen's vocabulary under Mistral's template: no family's fingerprint."""
    return qwen_tokenizer(llama_cpp_template("mistralai-Mistral-Nemo-Instruct-2407.jinja"))


async def test_the_detected_family_is_used_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = qwen_tokenizer(llama_cpp_template("Qwen3.5-4B.jinja"))
    with caplog.at_level(logging.INFO, logger="polar.gateway"):
        facts = await discover(config(tmp_path), engine(tokenizer))
    assert facts.renderer is not None and facts.renderer.family.name == "qwen3_5"
    assert facts.renderer.parser.name == "qwen3_coder"
    assert "model family qwen3_5 (detected), tool parser qwen3_coder" in caplog.text


async def test_an_unknown_family_under_auto_renders_in_the_engine_and_says_what_it_costs(
    tmp_path: Path,
) -> None:
    facts = await discover(config(tmp_path), engine(unknown_tokenizer()))
    assert facts.renderer is None and facts.render_mode == "engine"
    (note,) = [n for n in facts.notes if "no model family" in n]
    assert "render.family" in note and "split" in note


async def test_render_gateway_without_a_known_family_or_parser_refuses_to_start(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"render\.family .*render\.tool_parser"):
        await discover(config(tmp_path, mode="gateway"), engine(unknown_tokenizer()))


async def test_a_named_parser_serves_an_unknown_family_with_its_own_template(
    tmp_path: Path,
) -> None:
    facts = await discover(config(tmp_path, tool_parser="hermes"), engine(unknown_tokenizer()))
    assert facts.renderer is not None
    assert (facts.renderer.family.name, facts.renderer.parser.name) == ("tokenizer", "hermes")


async def test_config_names_the_family_and_overrides_parser_and_policy(tmp_path: Path) -> None:
    render = {"family": "qwen3", "tool_parser": "hermes", "reasoning_history": "keep"}
    facts = await discover(config(tmp_path, **render), engine(load_tokenizer()))
    renderer = facts.renderer
    assert renderer is not None and renderer.family.name == "qwen3"
    assert (renderer.parser.name, renderer.reasoning_history) == ("hermes", "keep")
    with pytest.raises(ConfigError, match="unknown model family 'nope'"):
        await discover(config(tmp_path, family="nope"), engine(load_tokenizer()))


async def test_eot_token_takes_one_token_or_several(tmp_path: Path) -> None:
    tok = load_tokenizer()
    ids = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<repo_name>")]
    render = {"eot_token": ["<|im_end|>", "<repo_name>"]}
    facts = await discover(config(tmp_path, **render), engine(tok))
    assert facts.renderer is not None
    assert facts.renderer.turn_ends == dict(zip(ids, render["eot_token"], strict=True))
    assert facts.renderer.eot_id == ids[0]  # the first: what a turn usually ends with
    facts = await discover(config(tmp_path, eot_token="<repo_name>"), engine(tok))
    assert facts.renderer is not None and facts.renderer.turn_ends == {ids[1]: "<repo_name>"}
    for empty in ([], [""], ""):
        with pytest.raises(ValueError, match="at least one non-empty token"):
            config(tmp_path, eot_token=empty)
