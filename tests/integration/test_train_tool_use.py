"""The tool-use recipe in short, through real Pi in bubblewrap: a scripted warm start (tool
calls the CLI really runs, graded by each task's own check, kept as prefix-merged multi-call
SFT rows), one SFT epoch on the served tiny model, one GRPO step, and the session-shape
metrics of both."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from polar.capture.store import CaptureStore
from polar.cli.train import load_config
from polar.engines.embedded import load_model
from polar.harnesses.install import default_prefix, install
from polar.rendering.chat_template import render_prompt
from polar.training.metrics import read_jsonl
from polar.training.trainer import EmbeddedTrainer
from polar.training.trainer_config import TrainConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pi_prefix() -> Path:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the harness install step needs it")
    return install(["pi"], default_prefix(), echo=lambda line: None)


def test_warm_start_then_grpo_through_pi_in_bubblewrap(tmp_path: Path, pi_prefix: Path) -> None:
    out = tmp_path / "run"
    config = TrainConfig.model_validate(
        {
            "model": "tiny",
            "steps": 1,
            "output_dir": str(out),
            "run_workers": 3,
            "tensorboard": False,
            "tasks": {
                "source": "tool_use",
                "options": {"ro_binds": [str(pi_prefix)], "timeout_s": 240},
                "per_step": 1,
                "num_samples": 2,
                "timeout_s": 600,
            },
            "eval": {"tasks": 1, "num_samples": 1},
            "sampling": {"max_tokens": 8, "temperature": 1.0},
            "sft": {"tasks": 3, "epochs": 1, "lr": 1e-3, "micro_batch_size": 2},
            "optim": {"micro_batch_size": 2},
            "checkpoint": {"every": 0},
        }
    )
    trainer = EmbeddedTrainer(config, loaded=load_model("tiny"))
    summary = trainer.run()

    # The demonstrator solved every task through Pi's bash tool: three calls (two tool calls,
    # then the summary) merged into one trace per session, with no merge break.
    (warm,) = read_jsonl(out / "warm_start.jsonl")
    assert warm["sessions"] == 3 and warm["pass_rate"] == 1.0, warm
    assert warm["calls_per_session"] == 3.0 and warm["calls_per_trace"] == 3.0
    assert warm["traces_per_session"] == 1.0 and warm["merge_breaks"] == 0
    assert warm["rows"] == 3 and warm["epochs"][0]["tokens"] > 0
    assert summary["sft"]["rows"] == 3

    rows = [orjson.loads(line) for line in (out / "sft.jsonl").read_bytes().splitlines()]
    store = CaptureStore(out / "demonstrations" / "captures.db")
    try:
        for row in rows:
            records = store.records(row["session"]["session_id"])
            assert len(records) == 3
            ids, mask = row["input_ids"], row["assistant_masks"]
            # exact engine tokens: the first prompt as the engine saw it, then each call's
            # sampled ids at the trainable positions, the tool result between them masked
            assert ids[: row["prompt_length"]] == records[0].prompt_ids
            sampled = [t for t, m in zip(ids, mask, strict=True) if m]
            assert sampled == [t for r in records for t in r.sampled_ids]
            for later in records[1:]:
                assert ids[: len(later.prompt_ids)] == later.prompt_ids
            assert '"name": "bash"' in trainer.core.tokenizer.decode(records[0].sampled_ids)
            # ... and the layout the served model itself renders for that conversation
            prompt = row["messages"][: row["num_prompt_messages"]]
            rendered = render_prompt(trainer.core.tokenizer, prompt, row["tools"] or None)
            assert rendered.ids == records[0].prompt_ids
    finally:
        store.close()

    # SFT was one policy version, the GRPO step the next; the step reports session shape.
    (step,) = read_jsonl(out / "metrics.jsonl")
    assert trainer.core.policy_version == 2 and step["policy_version"] == 2
    assert step["sessions"] == 2 and step["calls_per_session"] >= 1.0
    assert step["calls_per_trace"] >= 1.0 and step["merge_breaks"] >= 0
    assert step["logprob_mismatch_max"] < 1e-3

    # Held-out evaluations before the warm start, after it, and after GRPO: one session each.
    evals = read_jsonl(out / "eval.jsonl")
    assert [(e["step"], e.get("phase"), e["sessions"]) for e in evals] == [
        (0, None, 1),
        (0, "sft", 1),
        (1, None, 1),
    ]
    assert [e["policy_version"] for e in evals] == [0, 1, 2]


def test_gather_demonstrations_are_long_sessions_through_pi(
    tmp_path: Path, pi_prefix: Path
) -> None:
    """A ``gather`` chore's solution (a ``cat`` per file, then the answer) runs through Pi's bash
    tool as 5 to 7 calls, all merged into one trace: the builder ablation's long sessions."""
    out = tmp_path / "run"
    config = TrainConfig.model_validate(
        {
            "model": "tiny",
            "steps": 0,
            "output_dir": str(out),
            "run_workers": 2,
            "tensorboard": False,
            "tasks": {
                "source": "tool_use",
                "options": {
                    "ro_binds": [str(pi_prefix)],
                    "timeout_s": 240,
                    "kinds": ["gather"],
                    "max_calls": 10,
                },
                "timeout_s": 600,
            },
            "eval": {"tasks": 0},
            "sft": {"tasks": 2, "epochs": 1, "lr": 1e-3, "micro_batch_size": 2},
            "checkpoint": {"every": 0},
        }
    )
    EmbeddedTrainer(config, loaded=load_model("tiny")).run()
    (warm,) = read_jsonl(out / "warm_start.jsonl")
    assert warm["sessions"] == 2 and warm["pass_rate"] == 1.0, warm
    assert 5.0 <= warm["calls_per_session"] <= 7.0, warm
    assert warm["calls_per_trace"] == warm["calls_per_session"] and warm["merge_breaks"] == 0


def test_bundled_tool_use_config_loads() -> None:
    config = load_config("tool_use")
    assert config.tasks.source == "tool_use" and config.sft.tasks > 0
