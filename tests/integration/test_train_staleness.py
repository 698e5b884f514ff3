"""Staleness through the embedded trainer (issue 32): a session that keeps running while the
trainer makes two weight updates is masked by ``max_staleness`` and the trainer reports it.

The real path: the tiny model served by the embedded engine behind a gateway node and the
rollout server (``LocalStack.embedded``, as ``EmbeddedTrainer.run`` builds it); a real
process per session (a standard-library agent under the ``shell`` preset) that makes three
chat calls in one conversation and waits between them until the test lets it go on; two
ordinary training steps in between (gateway paused, the served module updated, the policy
version bumped and stamped); then the trainer trains on the long sessions.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from polar.client import RolloutClient
from polar.engines.embedded import load_model
from polar.schemas.sampling import SamplingPolicy
from polar.schemas.task import SessionResult, TaskRequest
from polar.schemas.trajectory import MaskReason
from polar.stack.local import LocalStack
from polar.training.gateway_control import GatewayControl
from polar.training.metrics import MetricsLog, read_jsonl
from polar.training.trainer import EmbeddedTrainer
from polar.training.trainer_config import TrainConfig

pytestmark = pytest.mark.slow

# Three calls in one conversation; before call i > 0 it waits for FLAGS/go-i, after each it
# leaves FLAGS/done-i-SESSION so the test knows the call was sampled.
LONG_AGENT = """\
import json, os, sys, time, urllib.request

flags, session = sys.argv[1], os.environ["POLAR_SESSION_ID"]
messages = [{"role": "user", "content": "Count to three, one number per turn."}]
for i in range(3):
    deadline = time.time() + 300
    while i and not os.path.exists(os.path.join(flags, f"go-{i}")):
        if time.time() > deadline:
            sys.exit(3)
        time.sleep(0.05)
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": "polar", "messages": messages}).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        content = json.load(reply)["choices"][0]["message"].get("content") or ""
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "Go on."}]
    open(os.path.join(flags, f"done-{i}-{session}"), "w").close()
open("answer.txt", "w").write(content)
"""


def config(out: Path, max_staleness: int | None = None) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": "tiny",
            "steps": 2,
            "output_dir": str(out),
            "runtime": "local",
            "run_workers": 4,
            "threads": 1,
            "tensorboard": False,
            "tasks": {
                "source": "integration.test_train_embedded:odd_length_tasks",
                "per_step": 1,
                "num_samples": 2,
                "timeout_s": 120,
            },
            "sampling": {"max_tokens": 6, "temperature": 0.7},
            "optim": {"lr": 1e-2, "micro_batch_size": 2},
            # a KL term: every trace takes part in the update, whatever its advantage
            "algorithm": {
                "advantage": {"std_normalize": False},
                "loss": {"kl_coef": 0.01},
                "max_staleness": max_staleness,
            },
        }
    )


def long_task(flags: Path) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "long-0",
            "instruction": "count",
            "num_samples": 2,
            "timeout_seconds": 300,
            "runtime": {"kind": "local", "files": {"agent.py": LONG_AGENT}},
            "agent": {"harness": "shell", "settings": {"command": f"python3 agent.py {flags}"}},
            "builder": {"strategy": "prefix_merging", "config": {"max_staleness": 1}},
            "evaluator": {"strategy": "test_on_output", "config": {"command": "true"}},
            # what the trainer stamps at submission: the version the session started under
            "metadata": {"group_id": "long-0", "policy_version": 0},
        }
    )


def wait_for(flags: Path, pattern: str, count: int) -> None:
    deadline = time.monotonic() + 120
    while len(list(flags.glob(pattern))) < count:
        assert time.monotonic() < deadline, f"no {pattern} from {count} sessions"
        time.sleep(0.05)


def test_a_session_across_two_weight_updates_is_masked_and_reported(tmp_path: Path) -> None:
    out, flags = tmp_path / "run", tmp_path / "flags"
    flags.mkdir()
    trainer = EmbeddedTrainer(config(out), loaded=load_model("tiny"))
    trainer.metrics = MetricsLog(out, tensorboard=False)
    sampling = SamplingPolicy(temperature=0.7, top_p=1.0, max_tokens=6)
    stack = LocalStack.embedded(
        trainer.core, out / "polar", sampling=sampling, runtime="local", run_workers=4
    )
    with stack, RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
        control = GatewayControl([stack.gateway_url], token=stack.gateway_token)
        try:
            client.submit(long_task(flags))
            wait_for(flags, "done-0-*", 2)  # first calls sampled at version 0
            steps = []
            for i in (1, 2):  # two ordinary steps: two updates while the long sessions wait
                steps.append(trainer.train_step(client, control))
                (flags / f"go-{i}").touch()
                wait_for(flags, f"done-{i}-*", 2)  # call i sampled at version i
            results: list[SessionResult] = client.wait(["long-0"], 120)["long-0"].results
            record = trainer.train_on(results, control)
        finally:
            control.close()
            trainer.metrics.close()
            trainer.core.close()

    assert [s["policy_version"] for s in steps] == [1, 2]
    assert all(s["staleness"]["stale_turns"] == 0 for s in steps)  # on-policy steps
    assert len(results) == 2 and all(r.status.value == "COMPLETED" for r in results)

    stale_tokens = trainable = 0
    for result in results:
        assert result.trajectory is not None
        traces = result.trajectory.traces
        calls = [
            (cid, version, span, trace)
            for trace in traces
            for cid, version, span in zip(
                trace.stats.completion_ids,
                trace.stats.call_versions,
                trace.stats.call_spans,
                strict=True,
            )
        ]
        assert [v for _, v, _, _ in calls] == [0, 1, 2]  # one call per policy version
        first_id, _, (start, end), first_trace = calls[0]
        # version 0 is 2 behind the current 2 > max_staleness 1: masked, with its reason
        masked = [(s.completion_id, s.reason) for t in traces for s in t.masked]
        assert masked == [(first_id, MaskReason.STALE)]
        assert first_trace.loss_mask[start:end] == [0] * (end - start)
        stale_tokens += end - start
        for _, _, (a, b), trace in calls[1:]:  # one and zero behind: trained
            assert trace.loss_mask[a:b] == [1] * (b - a)
            trainable += b - a

    # The trainer's step over them reports the lag and the masked turns, and trains the rest.
    assert record["step"] == 3 and record["policy_version"] == 3
    assert record["staleness"] == {
        "stale_turns": 2,
        "stale_tokens": stale_tokens,
        "version_lag_max": 2,
        "version_lag_mean": 1.0,
        "masked_at_consumption_turns": 0,  # the builder's mask already held call 0
        "masked_at_consumption_tokens": 0,
    }
    assert record["trainable_tokens"] == trainable > 0
    assert record["trained_tokens"] == trainable
    assert read_jsonl(out / "metrics.jsonl")[-1]["staleness"] == record["staleness"]
    assert record["turn_rewards"] == {
        "calls": 6,
        "scored": 0,
        "negative": 0,
        "mean": 0.0,
        "sessions_unscored": 2,
    }


def _calls(results: list[SessionResult]) -> list[tuple[int | None, list[int], bool]]:
    """Every call of the sessions: its version, its span's loss mask, whether masked stale."""
    calls = []
    for result in results:
        assert result.trajectory is not None
        for trace in result.trajectory.traces:
            stale = {s.completion_id for s in trace.masked if s.reason is MaskReason.STALE}
            for cid, version, (a, b) in zip(
                trace.stats.completion_ids,
                trace.stats.call_versions,
                trace.stats.call_spans,
                strict=True,
            ):
                calls.append((version, trace.loss_mask[a:b], cid in stale))
    return calls


def test_staleness_is_judged_when_the_trainer_consumes_the_session(tmp_path: Path) -> None:
    """A session sampled wholly at version 0 and handed to the trainer after two updates is
    masked (at build time nothing of it was stale: its newest call was version 0); a session
    spanning versions 0, 1 and 2 consumed at version 3 is masked call by call."""
    out, flags = tmp_path / "run", tmp_path / "flags"
    flags.mkdir()
    trainer = EmbeddedTrainer(config(out, max_staleness=1), loaded=load_model("tiny"))
    trainer.metrics = MetricsLog(out, tensorboard=False)
    sampling = SamplingPolicy(temperature=0.7, top_p=1.0, max_tokens=6)
    stack = LocalStack.embedded(
        trainer.core, out / "polar", sampling=sampling, runtime="local", run_workers=4
    )
    early = long_task(flags).model_copy(update={"task_id": "early-0"})
    spanning = long_task(flags)
    with stack, RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
        control = GatewayControl([stack.gateway_url], token=stack.gateway_token)
        try:
            (flags / "go-1").touch()
            (flags / "go-2").touch()
            client.submit(early)  # all three calls at version 0, finished before any update
            finished = client.wait(["early-0"], 120)["early-0"].results
            built = _calls(finished)
            for _ in (1, 2):
                trainer.train_step(client, control)
            late = trainer.train_on(finished, control)  # consumed at version 2
            for name in ("go-1", "go-2"):
                (flags / name).unlink()
            client.submit(spanning)
            wait_for(flags, "done-0-*", 4)  # 2 from the early sessions, 2 from these
            for i in (1, 2):
                trainer.train_step(client, control)
                (flags / f"go-{i}").touch()
                wait_for(flags, f"done-{i}-*", 4)
            spanned = client.wait(["long-0"], 120)["long-0"].results
            trainer.train_step(client, control)  # one more update before they are taken
            spanned_record = trainer.train_on(spanned, control)  # at version 6
        finally:
            control.close()
            trainer.metrics.close()
            trainer.core.close()

    # At build time none of the early sessions' calls was stale.
    assert [v for v, _, _ in built] == [0] * 6 and not any(stale for *_, stale in built)
    assert late["staleness"]["version_lag_max"] == 2
    assert late["staleness"]["masked_at_consumption_turns"] == 6
    assert late["staleness"]["stale_turns"] == 6
    assert late["trainable_tokens"] == 0 and late["trained_tokens"] == 0
    masked_tokens = sum(len(mask) for _, mask, _ in built)
    assert late["staleness"]["masked_at_consumption_tokens"] == masked_tokens > 0

    # The spanning sessions' calls were sampled at versions 3, 4 and 5 (three updates were
    # made before they started: two steps and the late consumption). The builder, at 5,
    # masked version 3; consumed at 6, lags 3, 2, 1 against max_staleness 1: version 4 is
    # masked now too, call by call, and version 5 is trained.
    calls = _calls(spanned)
    assert [v for v, _, _ in calls] == [3, 4, 5] * 2
    assert [stale for *_, stale in calls] == [True, False, False] * 2  # as built
    lag = spanned_record["staleness"]
    assert lag["version_lag_max"] == 3 and lag["stale_turns"] == 4
    assert lag["masked_at_consumption_turns"] == 2
    assert lag["masked_at_consumption_tokens"] == sum(len(m) for v, m, _ in calls if v == 4)
    kept = sum(len(mask) for v, mask, _ in calls if v == 5)
    assert spanned_record["trainable_tokens"] == kept > 0
