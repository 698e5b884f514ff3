"""Parsers of text decoded with special tokens kept: Kimi K2, MiniMax M2, DeepSeek V3.2, gpt-oss.

Each family's canonical layout, non-canonical samples (whitespace, key order, a leftover turn
end), parallel calls, reasoning-only turns, and the malformed-call policy (the whole turn
becomes plain content, the reasoning stays split off).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.rendering.parsers.base import ParsedTurn
from polar.rendering.parsers.deepseek_v32 import DeepSeekV32ToolParser
from polar.rendering.parsers.harmony import HarmonyToolParser
from polar.rendering.parsers.kimi_k2 import KimiK2ToolParser
from polar.rendering.parsers.minimax_m2 import MiniMaxM2ToolParser
from polar.rendering.parsers.special_text import split_reasoning, strip_trailers

ID_RE = re.compile(r"call_[0-9a-f]{24}")
BASH: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {
            "type": "object",
            "properties": {
                "cmd": {"type": "string"},
                "timeout": {"type": "integer"},
                "env": {"type": "object"},
                "dry": {"type": "boolean"},
            },
        },
    },
}
TOOLS = [BASH]


def calls_of(turn: ParsedTurn) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for call in turn.tool_calls:
        args = json.loads(call.arguments)
        assert call.arguments == json.dumps(args, ensure_ascii=False)
        out.append((call.name, args))
    return out


# Kimi K2 ----------------------------------------------------------------------------------

KIMI_CALL = (
    "<|tool_call_begin|>functions.bash:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
)


def kimi_section(*calls: str) -> str:
    return "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"


def test_kimi_keeps_the_models_ids_and_text_byte_for_byte() -> None:
    text = (
        "\nLet me look.\n</think>I'll list it."
        + kimi_section(
            KIMI_CALL.format(i=0, args='{"cmd": "ls"}'),
            KIMI_CALL.format(i=1, args='{"timeout":5,"cmd":"pwd"}'),
        )
        + "<|im_end|>"
    )
    turn = KimiK2ToolParser().parse(text, TOOLS)
    assert turn.reasoning == "\nLet me look.\n"
    assert turn.content == "I'll list it."
    assert [c.id for c in turn.tool_calls] == ["functions.bash:0", "functions.bash:1"]
    assert calls_of(turn) == [("bash", {"cmd": "ls"}), ("bash", {"timeout": 5, "cmd": "pwd"})]


def test_kimi_reads_spaced_markup_and_dotted_names() -> None:
    text = "</think>" + kimi_section(
        "<|tool_call_begin|> functions.mcp.fs:read:3 \n<|tool_call_argument_begin|> "
        '\n{"p": "a"}\n <|tool_call_end|>\n'
    )
    turn = KimiK2ToolParser().parse(text)
    assert turn.tool_calls[0].id == "functions.mcp.fs:read:3"
    assert calls_of(turn) == [("mcp.fs:read", {"p": "a"})]
    assert turn.reasoning == "" and turn.content == ""


@pytest.mark.parametrize(
    "section",
    [
        kimi_section(KIMI_CALL.format(i=0, args='{"cmd": ')),
        kimi_section(KIMI_CALL.format(i="x", args='{"cmd": "ls"}')),
        kimi_section("junk" + KIMI_CALL.format(i=0, args="{}")),
        kimi_section(KIMI_CALL.format(i=0, args="[1]")),
        kimi_section(),
        "<|tool_calls_section_begin|>" + KIMI_CALL.format(i=0, args="{}"),
    ],
)
def test_kimi_malformed_section_is_content(section: str) -> None:
    turn = KimiK2ToolParser().parse("why</think>text" + section)
    assert turn.tool_calls == []
    assert turn.reasoning == "why"
    assert turn.content == "text" + section


def test_kimi_reasoning_only_and_cut_off_thought() -> None:
    assert KimiK2ToolParser().parse("only thinking</think>") == ParsedTurn("", "only thinking", [])
    cut = KimiK2ToolParser().parse("<think>still going")
    assert cut == ParsedTurn("", "still going", [])
    assert KimiK2ToolParser().parse("plain") == ParsedTurn("plain", None, [])


# MiniMax M2 -------------------------------------------------------------------------------


def minimax_block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


def minimax_invoke(name: str, **params: str) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params.items())
    return f'<invoke name="{name}">\n{body}</invoke>\n'


def test_minimax_canonical_turn_types_values_by_schema() -> None:
    text = (
        "I need the files.\n</think>\n\nListing.\n"
        + minimax_block(
            minimax_invoke("bash", cmd="ls -la", timeout="30", env='{"A": "1"}', dry="true"),
            minimax_invoke("read", path="a.txt"),
        )
        + "[e~["
    )
    turn = MiniMaxM2ToolParser().parse(text, TOOLS)
    assert turn.reasoning == "I need the files."
    assert turn.content == "Listing."
    assert calls_of(turn) == [
        ("bash", {"cmd": "ls -la", "timeout": 30, "env": {"A": "1"}, "dry": True}),
        ("read", {"path": "a.txt"}),
    ]
    assert all(ID_RE.fullmatch(c.id) for c in turn.tool_calls)


def test_minimax_non_canonical_whitespace_and_quotes() -> None:
    text = (
        "</think>"
        "<minimax:tool_call>  <invoke name='bash' >\n\n"
        "<parameter  name = \"timeout\">7</parameter>  <parameter name='cmd'>echo 1</parameter>"
        "\n</invoke></minimax:tool_call>\n"
    )
    turn = MiniMaxM2ToolParser().parse(text, TOOLS)
    assert calls_of(turn) == [("bash", {"timeout": 7, "cmd": "echo 1"})]
    assert turn.content == ""


def test_minimax_string_typed_value_stays_a_string() -> None:
    turn = MiniMaxM2ToolParser().parse(minimax_block(minimax_invoke("bash", cmd="42")), TOOLS)
    assert calls_of(turn) == [("bash", {"cmd": "42"})]


@pytest.mark.parametrize(
    "block",
    [
        minimax_block('<invoke name="bash">\n<parameter name="cmd">ls</invoke>\n'),
        minimax_block('<invoke name="">\n</invoke>\n'),
        minimax_block("stray text"),
        minimax_block(minimax_invoke("bash", cmd="ls") + "trailing"),
        minimax_block(
            '<invoke name="bash"><parameter name="cmd">a</parameter>'
            '<parameter name="cmd">b</parameter></invoke>'
        ),
    ],
)
def test_minimax_malformed_block_is_content(block: str) -> None:
    turn = MiniMaxM2ToolParser().parse("hm\n</think>\n\nok\n" + block)
    assert turn.tool_calls == []
    assert turn.reasoning == "hm"
    assert turn.content == "ok\n" + block


# DeepSeek V3.2 ----------------------------------------------------------------------------

DS = "｜DSML｜"


def ds_block(*invokes: str) -> str:
    return f"<{DS}function_calls>\n" + "\n".join(invokes) + f"\n</{DS}function_calls>"


def ds_invoke(name: str, *params: tuple[str, str, str]) -> str:
    lines = [f'<{DS}parameter name="{k}" string="{s}">{v}</{DS}parameter>' for k, s, v in params]
    return f'<{DS}invoke name="{name}">\n' + "\n".join(lines) + f"\n</{DS}invoke>"


def test_deepseek_canonical_parallel_calls() -> None:
    text = (
        "plan</think>Running two.\n\n"
        + ds_block(
            ds_invoke("bash", ("cmd", "true", "ls"), ("timeout", "false", "30")),
            ds_invoke("bash", ("cmd", "true", "42"), ("env", "false", '{"K": [1, 2]}')),
        )
        + "<｜end▁of▁sentence｜>"
    )
    turn = DeepSeekV32ToolParser().parse(text, TOOLS)
    assert turn.reasoning == "plan"
    assert turn.content == "Running two."
    assert calls_of(turn) == [
        ("bash", {"cmd": "ls", "timeout": 30}),
        ("bash", {"cmd": "42", "env": {"K": [1, 2]}}),
    ]


def test_deepseek_chat_mode_and_loose_markup() -> None:
    text = (
        f'<{DS}function_calls>\n  <{DS}invoke  name="bash" >\n'
        f'<{DS}parameter name="timeout">9</{DS}parameter>\n'
        f'<{DS}parameter name="dry" string="false">not json</{DS}parameter>\n'
        f"</{DS}invoke>\n</{DS}function_calls>"
    )
    turn = DeepSeekV32ToolParser().parse(text, TOOLS)
    assert turn.reasoning is None and turn.content == ""
    assert calls_of(turn) == [("bash", {"timeout": 9, "dry": "not json"})]


@pytest.mark.parametrize(
    "block",
    [
        ds_block(ds_invoke("bash", ("cmd", "true", "ls"))) + " trailing",
        ds_block(f'<{DS}invoke name="bash">\n<{DS}parameter name="cmd">ls\n</{DS}invoke>'),
        ds_block("junk"),
        ds_block(ds_invoke("bash", ("cmd", "true", "a"), ("cmd", "true", "b"))),
    ],
)
def test_deepseek_malformed_block_is_content(block: str) -> None:
    turn = DeepSeekV32ToolParser().parse("r</think>c\n\n" + block)
    assert turn.tool_calls == []
    assert turn.reasoning == "r"
    assert turn.content == "c\n\n" + block


# gpt-oss (harmony) ------------------------------------------------------------------------


def test_harmony_analysis_then_call() -> None:
    text = (
        "<|channel|>analysis<|message|>Need to list.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json"
        '<|message|>{"cmd":"ls","timeout":3}<|call|>'
    )
    turn = HarmonyToolParser().parse(text, TOOLS)
    assert turn.reasoning == "Need to list."
    assert turn.content == ""
    assert calls_of(turn) == [("bash", {"cmd": "ls", "timeout": 3})]


def test_harmony_recipient_before_channel_and_preamble() -> None:
    text = (
        "<|channel|>commentary<|message|>Checking now.<|end|>"
        "<|start|>assistant to=functions.bash<|channel|>commentary json"
        '<|message|> {"cmd": "pwd"} '
    )
    turn = HarmonyToolParser().parse(text, TOOLS)
    assert turn.reasoning is None
    assert turn.content == "Checking now."
    assert calls_of(turn) == [("bash", {"cmd": "pwd"})]


def test_harmony_final_answer_and_reasoning_only() -> None:
    final = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>B"
    assert HarmonyToolParser().parse(final + "<|return|>") == ParsedTurn("B", "a", [])
    only = HarmonyToolParser().parse("<|channel|>analysis<|message|>thinking...")
    assert only == ParsedTurn("", "thinking...", [])


@pytest.mark.parametrize(
    "text",
    [
        "no markup at all",
        "<|channel|>final no message token",
        "<|channel|>analysis<|message|>x<|end|><|start|>user<|message|>hi",
    ],
)
def test_harmony_broken_markup_is_content(text: str) -> None:
    assert HarmonyToolParser().parse(text) == ParsedTurn(text, None, [])


def test_harmony_malformed_call_keeps_reasoning() -> None:
    call = "<|start|>assistant<|channel|>commentary to=functions.bash<|message|>{oops<|call|>"
    turn = HarmonyToolParser().parse("<|channel|>analysis<|message|>r<|end|>" + call)
    assert turn.tool_calls == []
    assert turn.reasoning == "r"
    assert turn.content == call.removesuffix("<|call|>")


# Shared helpers and properties ------------------------------------------------------------


def test_strip_trailers_and_split_reasoning() -> None:
    assert strip_trailers("a<|call|><|endoftext|>", ("<|call|>", "<|endoftext|>")) == "a"
    assert strip_trailers("a", ("",)) == "a"
    assert split_reasoning("<think>x</think>y</think>") == ("x", "y</think>")
    assert split_reasoning("no thought") == (None, "no thought")


ARGS = st.dictionaries(
    st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=8),
    st.one_of(st.integers(-(10**6), 10**6), st.booleans(), st.none(), st.text(max_size=20)),
    max_size=4,
)
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(ARGS)
def test_kimi_and_harmony_arguments_round_trip(args: dict[str, Any]) -> None:
    dumped = json.dumps(args, ensure_ascii=False)
    kimi = KimiK2ToolParser().parse("</think>" + kimi_section(KIMI_CALL.format(i=0, args=dumped)))
    assert calls_of(kimi) == [("bash", args)]
    harmony = HarmonyToolParser().parse(
        f"<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{dumped}<|call|>"
    )
    assert calls_of(harmony) == [("bash", args)]


@PROPERTY
@given(st.dictionaries(st.sampled_from(["cmd", "timeout", "env"]), st.integers(0, 99), min_size=1))
def test_xml_formats_type_by_schema(args: dict[str, int]) -> None:
    expected = {k: (str(v) if k == "cmd" else v) for k, v in args.items()}
    params = {k: str(v) for k, v in args.items()}
    minimax = MiniMaxM2ToolParser().parse(minimax_block(minimax_invoke("bash", **params)), TOOLS)
    assert calls_of(minimax) == [("bash", expected)]
    ds = DeepSeekV32ToolParser().parse(
        ds_block(ds_invoke("bash", *[(k, "false", v) for k, v in params.items()])), TOOLS
    )
    assert calls_of(ds) == [("bash", {k: int(v) for k, v in params.items()})]


# tool_choice patterns ---------------------------------------------------------------------

READ: dict[str, Any] = {
    "name": "read",
    "parameters": {"type": "object", "properties": {"path": {}}},
}
MINIMAX_TWO = minimax_block(
    minimax_invoke("bash", cmd="ls", timeout="3"), minimax_invoke("read", path="a")
)
DS_TWO = "\n\n" + ds_block(
    ds_invoke("bash", ("cmd", "true", "ls"), ("timeout", "false", "3")),
    ds_invoke("read", ("path", "true", "a")),
)


@pytest.mark.parametrize(
    ("parser", "two_calls", "thought"),
    [
        (MiniMaxM2ToolParser(), MINIMAX_TWO, "Plan.\n</think>\n\n"),
        (DeepSeekV32ToolParser(), DS_TWO, ""),
    ],
)
def test_call_patterns_force_the_formats_own_calls(
    parser: Any, two_calls: str, thought: str
) -> None:
    functions = [BASH["function"], READ]
    both = parser.call_pattern(functions, True)
    assert re.fullmatch(both, thought + two_calls)
    assert calls_of(parser.parse(thought + two_calls, [*TOOLS, {"function": READ}])) == [
        ("bash", {"cmd": "ls", "timeout": 3}),
        ("read", {"path": "a"}),
    ]
    assert not re.fullmatch(parser.call_pattern(functions, False), two_calls)
    assert not re.fullmatch(parser.call_pattern([BASH["function"]], True), two_calls)
    assert not re.fullmatch(both, "Just text.")


def test_special_token_formats_cannot_be_forced() -> None:
    assert KimiK2ToolParser().call_pattern([BASH["function"]], True) is None
    assert HarmonyToolParser().call_pattern([BASH["function"]], True) is None
