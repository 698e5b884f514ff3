"""The bundled SWE tasks as RL tasks: written by ``polar swe tasks``, run by ``polar submit``
against a rollout server, and drawn by ``polar train``'s ``swe`` task source for GRPO steps."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar.capture.store import CaptureStore
from polar.cli.main import main
from polar.client import RolloutClient
from polar.engines.embedded import load_model
from polar.engines.registry import EngineConfig
from polar.engines.scripted import ScriptedEngine
from polar.harnesses.bundled import AGENT_PATH
from polar.stack.local import LocalStack
from polar.training.metrics import read_jsonl
from polar.training.trainer import EmbeddedTrainer
from polar.training.trainer_config import TrainConfig

from .swe_kit import FIX_TEXTKIT, LARGE_CONTEXT, MODEL, scripted_backend

pytestmark = [
    pytest.mark.slow,
    # The SWE tasks' sessions and their grading run in bubblewrap (SWETaskOptions' default).
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed"),
]

# The bundled agent (a real chat-completions tool loop), bound read-only into each sandbox.
AGENT_OPTIONS: dict[str, Any] = {
    "harness": "shell",
    "settings": {
        "command": f"python3 {shlex.quote(str(AGENT_PATH))} --max-turns 3 {{instruction}}"
    },
    "ro_binds": [str(AGENT_PATH)],
    "timeout_s": 180,
    "test_timeout_s": 60,
}


def test_polar_swe_tasks_then_polar_submit_grades_a_bundled_task(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    options = tmp_path / "options.yaml"
    options.write_text(yaml.safe_dump({**AGENT_OPTIONS, "model_name": MODEL}))
    out = tmp_path / "tasks"
    assert main(["swe", "tasks", "--bundled", "--out", str(out), "--options", str(options)]) == 0
    written = sorted(p.name for p in out.glob("*.yaml"))
    assert len(written) == 3, written
    textkit = next(p for p in out.glob("*.yaml") if "textkit" in p.name)

    backend = scripted_backend(
        tokenizer, ("shell", "command"), {"polar-bundled__textkit-1": FIX_TEXTKIT}
    )
    stack = LocalStack(
        ScriptedEngine(backend),
        tmp_path / "run",
        engine_config=EngineConfig(kind="scripted"),
        served_model=backend.model_name,
        context_window=LARGE_CONTEXT,
    )
    with stack:
        url, token = stack.rollout_url, stack.rollout_token or ""
        code = main(["submit", str(textkit), "--url", url, f"--token={token}", "--wait"])
        assert code == 0, capsys.readouterr().out
        task_id = yaml.safe_load(textkit.read_text())["task_id"]
        with RolloutClient(url, token=token) as client:
            (result,) = client.result(task_id).results
    assert result.reward == 1.0
    assert result.evaluation is not None
    assert result.evaluation.details["resolution"] == "RESOLVED_FULL"


def test_polar_train_draws_grpo_groups_from_the_swe_task_source(tmp_path: Path) -> None:
    out = tmp_path / "train"
    config = TrainConfig.model_validate(
        {
            "model": "tiny",
            "steps": 1,
            "output_dir": str(out),
            "run_workers": 2,
            "tasks": {
                "source": "swe",
                "options": {**AGENT_OPTIONS, "repos_dir": str(tmp_path / "repos")},
                "per_step": 1,
                "num_samples": 2,
                "timeout_s": 300,
            },
            "eval": {"tasks": 0},
            "sampling": {"max_tokens": 8, "temperature": 1.0},
            "optim": {"micro_batch_size": 2, "minibatches": 1},
            "checkpoint": {"every": 0},
        }
    )
    EmbeddedTrainer(config, loaded=load_model("tiny")).run()

    (step,) = read_jsonl(out / "metrics.jsonl")
    assert step["sessions"] == 2 and step["statuses"] == {"COMPLETED": 2}
    # A random tiny model fixes nothing: swe_tests graded both sessions unresolved.
    assert step["reward_mean"] == 0.0
    store = CaptureStore(out / "polar" / "captures.db")
    try:
        prompts = [r.request for sid in store.session_ids() for r in store.records(sid)]
    finally:
        store.close()
    assert prompts and all("<issue>" in str(p) for p in prompts)
