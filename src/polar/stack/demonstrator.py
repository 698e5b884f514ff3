"""A scripted demonstrator: an engine that resolves each instance with its gold patch, through
the harness's own shell tool.

It is not a model. For every instance it answers the session's first call with one tool call of
the harness's shell tool that applies the instance's gold ``patch`` with ``git apply`` (the real
CLI runs it in the sandbox; its output comes back as the tool result), and the next call with a
one-line summary. The tokens are real: the scripted engine renders prompts with the SmolLM2
tokenizer and chat template and samples by tokenizing its replies, so an accepted attempt is an
SFT example in exactly the token layout that model trains on. ``polar generate --demonstrator``
uses it to give a newcomer an accepted dataset in seconds, and it is the warm-start data of a
recipe whose model cannot yet use the harness's tools at all. Every row it produces is marked by
the run's model name (``scripted-demonstrator``) in the ledger and dataset.

:func:`solution_script` is the same demonstrator for any task with a known solution (shell
commands that solve it): one tool call per command, then a one-line summary. A trainer's warm
start (:mod:`polar.training.sft`) runs it through the very harness it then trains in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polar.engines.registry import EngineConfig
from polar.engines.scripted import ScriptedEngine
from polar.engines.scripted_backend import ScriptedBackend
from polar.engines.scripted_script import ConversationScript, ScriptedReply
from polar.errors import ConfigError
from polar.harnesses.base import ShellTool
from polar.harnesses.registry import create_harness, local_presets
from polar.rendering.model_files import load_tokenizer
from polar.stack.plan import EngineHandle
from polar.swe.instances import SWEInstance

MODEL_NAME = "scripted-demonstrator"
CONTEXT_WINDOW = 8192
"""SmolLM2's: a demonstration longer than the model it is for can train on is refused."""
SUMMARY = "I applied the fix for the issue; the repository's tests should pass now."
_DELIMITER = "POLAR_GOLD_PATCH"


def shell_tool(harness: str) -> ShellTool:
    """The shell tool the demonstrator calls: the preset's own (a CLI's or the bundled agent's)."""
    known = local_presets()
    tool = create_harness(harness).shell_tool if harness in known else None
    if tool is None:
        able = [name for name in known if create_harness(name).shell_tool is not None]
        raise ConfigError(
            f"the demonstrator drives a harness through its shell tool; {harness!r} names none "
            f"(use {', '.join(able)})"
        )
    return tool


def apply_command(patch: str) -> str:
    """A shell command that applies ``patch`` in the working directory and shows what changed."""
    if _DELIMITER in patch:
        raise ConfigError(f"a gold patch contains the heredoc delimiter {_DELIMITER}")
    body = patch if patch.endswith("\n") else patch + "\n"
    return f"git apply <<'{_DELIMITER}'\n{body}{_DELIMITER}\ngit diff --stat"


def marker(instance: SWEInstance) -> str:
    """Text only this instance's conversation holds: its problem statement's longest line."""
    return max(instance.problem_statement.splitlines(), key=len).strip()


def demonstrator_script(instances: list[SWEInstance], harness: str) -> ConversationScript:
    """One two-turn script per instance with a gold patch, told apart by its issue text."""
    tool = shell_tool(harness)
    rules: dict[str, list[ScriptedReply]] = {}
    for instance in instances:
        if not instance.patch.strip():
            continue
        key = marker(instance)
        if not key or key in rules:
            raise ConfigError(
                f"instance {instance.instance_id}'s issue text does not set it apart from the "
                "others: the demonstrator cannot tell its sessions apart"
            )
        call = ScriptedReply(tool_calls=[tool.call(apply_command(instance.patch))])
        rules[key] = [call, ScriptedReply(content=SUMMARY)]
    if not rules:
        raise ConfigError("no instance has a gold patch for the demonstrator to apply")
    return ConversationScript(rules, default=ScriptedReply(content=SUMMARY))


def solution_script(
    solutions: Mapping[str, Sequence[str]], tool: ShellTool, summary: str = "Done."
) -> ConversationScript:
    """Per task (keyed by text only its conversation holds, e.g. its instruction), a call of
    ``tool`` for each of its solution commands, one per turn, then ``summary``."""
    rules = {
        key: [*(ScriptedReply(tool_calls=[tool.call(c)]) for c in commands), ScriptedReply(summary)]
        for key, commands in solutions.items()
    }
    if not rules or not all(solutions.values()):
        raise ConfigError("the demonstrator needs a solution command for every task")
    return ConversationScript(rules, default=ScriptedReply(content=summary))


def demonstrator_engine(instances: list[SWEInstance], harness: str) -> EngineHandle:
    """The demonstrator, served in process like any engine a run can take."""
    tokenizer = load_tokenizer()
    backend = ScriptedBackend(
        demonstrator_script(instances, harness),
        tokenizer=tokenizer,
        model_name=MODEL_NAME,
        max_model_len=CONTEXT_WINDOW,
    )
    return EngineHandle(
        engine=ScriptedEngine(backend),
        config=EngineConfig(kind="scripted"),
        label="scripted demonstrator (gold patches)",
        served_model=MODEL_NAME,
        context_window=CONTEXT_WINDOW,
        tokenizer=tokenizer,
    )
