"""Text-only rendering never turns a non-text part into text: it refuses it by name."""

from __future__ import annotations

import pytest

from polar.errors import InvalidRequest
from polar.rendering.tool_text import flatten_content, messages_for_plain_template


def test_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert flatten_content(parts) == "a\nb"
    assert flatten_content(None) == "" and flatten_content("x") == "x"


def test_an_image_part_is_refused_by_name_never_rendered_as_a_placeholder() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(InvalidRequest, match="'image_url' content part"):
        messages_for_plain_template([{"role": "user", "content": [image]}], None)
