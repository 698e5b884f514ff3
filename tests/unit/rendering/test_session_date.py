"""A template that prints today's date (gpt-oss's ``Current date:``) prints the session's start
date on every render of that session, so a session crossing midnight keeps one prompt prefix."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from artifacts import llama_cpp_template  # tests/artifacts.py
from polar.providers.types import NormalizedRequest
from polar.rendering.families.registry import get_family
from polar.rendering.renderer import Renderer
from polar.rendering.turns import TurnBook

from .test_special_token_families import GPT_OSS_SPECIALS

BEFORE_MIDNIGHT = datetime(2026, 3, 14, 23, 59, 30)


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    from transformers import AutoTokenizer

    from polar.rendering.model_files import load_tokenizer, tokenizer_cache_path

    load_tokenizer()
    tok = AutoTokenizer.from_pretrained(str(tokenizer_cache_path()), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": list(GPT_OSS_SPECIALS)})
    tok.chat_template = llama_cpp_template("openai-gpt-oss-120b.jinja")
    return Renderer(tok, get_family("gpt_oss"))


def _request(messages: list[dict[str, Any]]) -> NormalizedRequest:
    return NormalizedRequest("openai_chat", "m", messages)


def _text(renderer: Renderer, book: TurnBook, messages: list[dict[str, Any]]) -> str:
    return str(renderer.tokenizer.decode(renderer.plan(book, _request(messages)).ids))


def test_every_render_of_a_session_prints_the_date_it_started(renderer: Renderer) -> None:
    book = TurnBook(started=BEFORE_MIDNIGHT)
    first = _text(renderer, book, [{"role": "user", "content": "hi"}])
    later = _text(
        renderer,
        book,
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},  # not sampled here: rendered whole
            {"role": "user", "content": "and now?"},
        ],
    )
    today = datetime.now().strftime("%Y-%m-%d")
    for text in (first, later):
        assert "Current date: 2026-03-14\n" in text and f"Current date: {today}" not in text
    head = first.split("<|start|>user")[0]
    assert later.startswith(head)  # the system prompt is one prefix for the whole session


def test_a_render_outside_any_session_prints_today_as_vllm_does(renderer: Renderer) -> None:
    text = renderer.render([{"role": "user", "content": "hi"}], None)
    assert f"Current date: {datetime.now().strftime('%Y-%m-%d')}\n" in text


def test_sessions_started_on_different_days_print_their_own_dates(renderer: Renderer) -> None:
    other = TurnBook(started=datetime(2026, 3, 15, 0, 0, 5))
    text = _text(renderer, other, [{"role": "user", "content": "hi"}])
    assert "Current date: 2026-03-15\n" in text
