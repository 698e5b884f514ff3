"""verl 0.9.1's own agent-loop worker runs Polar's agent loop against a live rollout server,
gateway node, one-call agent processes and the embedded engine, and the batch it builds carries
exactly the ids and logprobs the engine sampled.

verl pins transformers below Polar's, so it lives in its own venv (``.venv-verl``, built by
.ci/run; or ``POLAR_VERL_PYTHON``), and ``verl_worker.py`` runs there: verl's hydra defaults and
command-line overrides, the agent-loop YAML of docs/training.md loaded by ``AgentLoopWorker``,
verl's dataset and collate, the trainer's batch steps, ``generate_sequences`` with its
per-sample post-processing into a ``DataProto``, and verl's GRPO advantage. Ray, verl's LLM
servers and training do not run (see verl_worker.py). Under CI a missing verl fails the test.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from polar.capture.store import CaptureStore
from polar.engines.embedded import EmbeddedEngineCore, load_model
from polar.gateway.config import SamplingPolicy
from polar.stack.local import LocalStack

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROMPT_LENGTH = 256
RESPONSE_LENGTH = 16
N = 4  # rollout.n: one GRPO group of 4 sessions per prompt
PROMPTS = ["What is 1 + 1?", "What is 2 + 3?"]


def verl_python() -> str:
    explicit = os.environ.get("POLAR_VERL_PYTHON")
    local = REPO / ".venv-verl" / "bin" / "python"
    if explicit:
        return explicit
    if local.is_file():
        return str(local)
    reason = "verl is not installed: .ci/run builds .venv-verl (or set POLAR_VERL_PYTHON)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI installs it, so this test must run there")
    pytest.skip(reason)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[EmbeddedEngineCore, LocalStack]]:
    core = EmbeddedEngineCore(load_model("tiny"))
    stack = LocalStack.embedded(
        core, tmp_path / "polar", sampling=SamplingPolicy(max_tokens=6), runtime="local"
    ).start()
    yield core, stack
    stack.stop()
    core.close()


def run_verl(python: str, stack: LocalStack, core: EmbeddedEngineCore, work: Path) -> Any:
    model_dir = work / "model"  # what verl's HFModelConfig reads: the served model's config
    config = copy.deepcopy(core.module.config)
    config.architectures = [type(core.module).__name__]
    config.save_pretrained(model_dir)
    core.tokenizer.save_pretrained(model_dir)
    spec = {
        "rollout_url": stack.rollout_url,
        "model_dir": str(model_dir),
        "prompt_length": PROMPT_LENGTH,
        "response_length": RESPONSE_LENGTH,
        "n": N,
        "prompts": PROMPTS,
        "out": str(work / "batch.pt"),
    }
    (work / "spec.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "POLAR_ROLLOUT_TOKEN": stack.rollout_token or "",
        "PYTHONPATH": str(REPO / "src"),  # this checkout's Polar, whatever the venv holds
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    done = subprocess.run(
        [python, str(Path(__file__).with_name("verl_worker.py")), str(work / "spec.json")],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (
        f"verl's worker failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    )
    return torch.load(work / "batch.pt", weights_only=True)


def test_verl_agent_loop_worker_batches_what_the_engine_sampled(
    served: tuple[EmbeddedEngineCore, LocalStack], tmp_path: Path
) -> None:
    python = verl_python()
    core, stack = served
    work = tmp_path / "verl"
    work.mkdir()
    out = run_verl(python, stack, core, work)
    batch = out["tensors"]
    rows = len(PROMPTS) * N
    assert batch["prompts"].shape == (rows, PROMPT_LENGTH)
    assert batch["responses"].shape == (rows, RESPONSE_LENGTH)
    assert batch["input_ids"].shape == (rows, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert out["uid"] == [f"prompt-{i}" for i in range(len(PROMPTS)) for _ in range(N)]
    assert len(set(out["session_ids"])) == rows  # one Polar session per sample
    # The YAML entry (what a user writes) and the in-process register_agent_loop both ran.
    assert out["agents"] == ["polar"] * N + ["polar_registered"] * N
    # What make_task receives (docs/training.md): verl's dataset row, as its worker passes it.
    assert {"raw_prompt", "index", "extra_info", "data_source", "uid"} <= set(out["row_keys"])

    store = CaptureStore(stack.work_dir / "captures.db")
    try:
        rewards = []
        for i, session_id in enumerate(out["session_ids"]):
            [record] = store.records(session_id)
            attention = batch["attention_mask"][i]
            prompt_seen = attention[:PROMPT_LENGTH].bool()
            response_seen = attention[PROMPT_LENGTH:].bool()
            mask = batch["response_mask"][i].bool()
            # verl left-pads the prompt and right-pads the response; both hold the engine's ids.
            assert batch["prompts"][i][prompt_seen].tolist() == record.prompt_ids
            assert not prompt_seen[: PROMPT_LENGTH - len(record.prompt_ids)].any()
            assert batch["responses"][i][mask].tolist() == record.sampled_ids
            assert (mask <= response_seen).all()  # no trainable padding
            assert batch["input_ids"][i].tolist() == (
                batch["prompts"][i].tolist() + batch["responses"][i].tolist()
            )
            logprobs = batch["rollout_log_probs"][i]
            assert logprobs[mask].tolist() == pytest.approx(record.logprobs, abs=1e-6)
            assert not logprobs[~response_seen].any()
            # The evaluator's reward sits on the last response token (verl's rm_scores).
            scores = batch["rm_scores"][i]
            last = int(response_seen.sum()) - 1
            assert scores[last] in (0.0, 1.0) and not scores[:last].any()
            rewards.append(float(scores[last]))
    finally:
        store.close()

    # verl's GRPO advantage over Polar's rewards, per uid group of N sessions.
    advantages = out["advantages"]
    for group in range(len(PROMPTS)):
        members = slice(group * N, (group + 1) * N)
        scores = torch.tensor(rewards[members])
        expected = (scores - scores.mean()) / (scores.std() + 1e-6)
        mask = batch["response_mask"][members].bool()
        for row, value in zip(range(group * N, (group + 1) * N), expected.tolist(), strict=True):
            assert advantages[row][mask[row - group * N]].tolist() == pytest.approx(
                [value] * int(mask[row - group * N].sum()), abs=1e-5
            )
