"""``polar generate`` over the bundled SWE set, end to end, with a scripted model.

Everything but the model is real: the rollout server and gateway node on loopback, the bundled
Python agent (a real harness process) in bubblewrap (local where bubblewrap cannot sandbox), a
git checkout of each bundled repository as the workspace, and the ``swe_tests`` evaluator
running the instance's tests in a fresh runtime. The scripted model follows one script per
instance (chosen by a phrase of its issue): it fixes two bugs with shell tool calls and looks
around without fixing the third. The tests hold the directory to what ``polar generate``
promises: a dataset of exactly the accepted attempts in both forms, a right acceptance table,
and resumption that runs only what is missing.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from polar.engines.registry import EngineConfig
from polar.engines.scripted import (
    ConversationScript,
    ScriptedBackend,
    ScriptedEngine,
    ScriptedReply,
)
from polar.generation.attempts import LEDGER, read_ledger
from polar.generation.collect import Collector
from polar.generation.options import GenerateOptions
from polar.generation.run import GenerateRun, run_generate
from polar.harnesses.bundled import AGENT
from polar.harnesses.install import default_prefix, installed_names
from polar.rendering.model_files import load_tokenizer
from polar.schemas.task import SessionStatus
from polar.stack.plan import EngineHandle

pytestmark = pytest.mark.slow

LEDGER_REPO = "polar-bundled/ledger"
SHOPCART_REPO = "polar-bundled/shopcart"
TEXTKIT_REPO = "polar-bundled/textkit"


def rewrite(path: str, old: str, new: str) -> str:
    """A shell command that fixes a line the way an agent would: a python3 one-off."""
    program = (
        "import pathlib\n"
        f"p = pathlib.Path({path!r})\n"
        f"text = p.read_text()\n"
        f"assert {old!r} in text\n"
        f"p.write_text(text.replace({old!r}, {new!r}))\n"
    )
    return f"python3 - <<'EOF'\n{program}EOF\npython3 -m pytest -q 2>&1 | tail -3"


def script_rules(tool: str = "shell") -> dict[str, list[ScriptedReply]]:
    """One script per bundled instance, keyed by a phrase of its issue; ``tool`` is the
    harness's shell tool (the bundled agent's ``shell``, Pi's ``bash``)."""

    def shell(command: str) -> ScriptedReply:
        return ScriptedReply(tool_calls=[(tool, {"command": command})])

    return {
        # ledger: fixed by rewriting the buggy lines.
        "split_evenly() loses cents": [
            shell("cat ledger/money.py"),
            shell(
                rewrite(
                    "ledger/money.py",
                    "    share = total_cents // parts\n    return [share] * parts\n",
                    "    share, extra = divmod(total_cents, parts)\n"
                    "    return [share + 1 if i < extra else share for i in range(parts)]\n",
                )
            ),
            ScriptedReply(content="Fixed split_evenly: the extra cents go to the first shares."),
        ],
        # shopcart: fixed with one edit.
        "Bulk discount is not applied at exactly 10 items": [
            shell(
                rewrite("shopcart/cart.py", "quantity > BULK_QUANTITY", "quantity >= BULK_QUANTITY")
            ),
            ScriptedReply(content="The bulk discount now applies at 10 items."),
        ],
        # textkit: the agent looks around and gives up; not resolved.
        "truncate() returns strings longer": [
            shell("ls -R textkit && grep -n suffix textkit/strings.py"),
            ScriptedReply(content="I could not find the problem."),
        ],
    }


SCRIPT_RULES = script_rules()


def scripted_engine(rules: dict[str, list[ScriptedReply]]) -> EngineHandle:
    backend = ScriptedBackend(
        ConversationScript(rules, default=ScriptedReply(content="Done.")),
        tokenizer=load_tokenizer(),
    )
    return EngineHandle(
        engine=ScriptedEngine(backend),
        config=EngineConfig(kind="scripted"),
        label="scripted",
        served_model=backend.model_name,
        context_window=backend.max_model_len,
        tokenizer=backend.tokenizer,
    )


def generate(
    out: Path, rules: dict[str, list[ScriptedReply]] | None = None, **options: Any
) -> GenerateRun:
    defaults: dict[str, Any] = {
        "bundled": True,
        "harness": AGENT,
        "attempts": 2,
        "concurrency": 3,
        "timeout_s": 120.0,
        "max_turns": 6,
        "task_options": {"test_timeout_s": 60.0},
    }
    console = Console(width=160, record=True)
    return run_generate(
        GenerateOptions(out=out, **{**defaults, **options}),
        console,
        scripted_engine(rules or SCRIPT_RULES),
    )


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def snapshot(out: Path) -> dict[str, bytes]:
    names = ("attempts.jsonl", "dataset.jsonl", "acceptance.json", "acceptance.md")
    return {name: (out / name).read_bytes() for name in names}


@pytest.fixture(scope="module", autouse=True)
def no_server_outlives_its_stack() -> Iterator[None]:
    """Every stack a run starts is gone when the run returns: before, a gateway with a model
    call in flight outlived its stop, and its node's heartbeat kept printing ConnectError
    lines after pytest ended."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t.name == "polar-server" and t not in before]
    assert not left, f"server threads outlived their stack: {left}"


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> GenerateRun:
    out = tmp_path_factory.mktemp("generate") / "out"
    started = time.monotonic()
    run = generate(out)
    print(f"first run: {time.monotonic() - started:.1f}s")
    return run


def test_the_dataset_holds_exactly_the_accepted_attempts(first: GenerateRun) -> None:
    out = first.out_dir
    assert first.run == 1 and first.submitted == 6 and not first.interrupted
    records = read_ledger(out / LEDGER)
    assert len(records) == 6 and len(lines(out / LEDGER)) == 6
    by_repo: dict[str, list[bool]] = {}
    for record in records.values():
        assert record.status == SessionStatus.COMPLETED, record.error
        by_repo.setdefault(record.repo, []).append(record.accepted)
        assert record.resolved is record.accepted and record.passed is record.accepted
        assert record.calls >= 2 and record.prompt_tokens > record.sampled_tokens > 0
        assert (out / record.result).is_file()
    assert by_repo == {
        LEDGER_REPO: [True, True],
        SHOPCART_REPO: [True, True],
        TEXTKIT_REPO: [False, False],
    }

    rows = lines(out / "dataset.jsonl")
    accepted = sorted(k for k, r in records.items() if r.accepted)
    assert sorted({(r["instance_id"], r["attempt"]) for r in rows}) == accepted
    assert first.dataset.rows == len(rows) >= 4
    for row in rows:
        assert row["repo"] in (LEDGER_REPO, SHOPCART_REPO) and row["resolved"] is True
        assert row["reward"] == 1.0
        # The model's patch, as the evaluator took it from the workspace.
        assert "diff --git" in row["model_patch"] and "+" in row["model_patch"]
        # Chat form, with the shell tool calls that made the fix.
        roles = [m["role"] for m in row["messages"]]
        assert roles[:2] == ["system", "user"] and "tool" in roles
        calls = [c for m in row["messages"] for c in m.get("tool_calls") or []]
        assert calls and all(c["function"]["name"] == "shell" for c in calls)
        assert row["tools"][0]["function"]["name"] == "shell"
        # Token form: the captured ids, loss only on what the model sampled.
        n = len(row["input_ids"])
        assert len(row["assistant_masks"]) == n and 0 < row["prompt_length"] < n
        assert not any(row["assistant_masks"][: row["prompt_length"]])
        assert sum(row["assistant_masks"]) > 0
    shopcart = next(r for r in rows if r["repo"] == SHOPCART_REPO)
    assert "quantity >= BULK_QUANTITY" in shopcart["model_patch"]
    table = pq.read_table(out / "dataset.parquet")
    assert table.num_rows == len(rows)
    assert table.column("input_ids").to_pylist() == [r["input_ids"] for r in rows]


def test_the_acceptance_table_counts_per_repo(first: GenerateRun) -> None:
    data = json.loads((first.out_dir / "acceptance.json").read_text())
    repos = data["repos"]
    assert {repo: (t["attempts"], t["accepted"]) for repo, t in repos.items()} == {
        LEDGER_REPO: (2, 2),
        SHOPCART_REPO: (2, 2),
        TEXTKIT_REPO: (2, 0),
    }
    assert repos[TEXTKIT_REPO]["rate"] == 0.0 and repos[LEDGER_REPO]["rate"] == 1.0
    total = data["total"]
    assert (total["attempts"], total["accepted"], total["rate"]) == (6, 4, 0.6667)
    assert (total["instances"], total["solved"]) == (3, 2)
    records = read_ledger(first.out_dir / LEDGER).values()
    assert total["prompt_tokens"] == sum(r.prompt_tokens for r in records) > 0
    assert total["sampled_tokens"] == sum(r.sampled_tokens for r in records) > 0
    assert data["facts"]["dataset_rows"] == first.dataset.rows
    md = (first.out_dir / "acceptance.md").read_text()
    assert f"| {TEXTKIT_REPO} | 1 | 0 | 2 | 0 | 0.0% |" in md
    assert "| **all** | **3** | **2** | **6** | **4** | **66.7%** |" in md


def test_a_rerun_resubmits_nothing_and_changes_nothing(first: GenerateRun) -> None:
    before = snapshot(first.out_dir)
    again = generate(first.out_dir)
    assert again.run is None and again.submitted == 0 and again.recorded == []
    assert snapshot(first.out_dir) == before
    assert not (first.out_dir / "runs" / "002").exists()


def test_more_attempts_and_retried_errors_run_only_what_is_missing(first: GenerateRun) -> None:
    out = first.out_dir
    # An attempt that failed for infrastructure reasons, appended as a later line.
    ledger_line = next(
        line for line in lines(out / LEDGER) if line["repo"] == LEDGER_REPO and line["attempt"] == 0
    )
    errored = {**ledger_line, "status": "ERROR", "accepted": False, "passed": False, "error": "x"}
    with (out / LEDGER).open("a") as f:
        f.write(json.dumps(errored) + "\n")
    third = generate(out, attempts=3, retry_errors=True)
    assert third.run == 2 and third.submitted == 4
    ran = sorted((r.instance_id, r.attempt) for r in third.recorded)
    ids = sorted({r.instance_id for r in third.recorded})
    ledger_id = ledger_line["instance_id"]
    assert ran == sorted([(ledger_id, 0)] + [(i, 2) for i in ids])
    assert all(r.run == 2 and r.status == SessionStatus.COMPLETED for r in third.recorded)
    records = read_ledger(out / LEDGER)
    assert len(records) == 9 and records[(ledger_id, 0)].accepted
    data = json.loads((out / "acceptance.json").read_text())
    assert (data["total"]["attempts"], data["total"]["accepted"]) == (9, 6)
    assert data["facts"]["runs"] == 2
    rows = lines(out / "dataset.jsonl")
    assert sorted({(r["instance_id"], r["attempt"]) for r in rows}) == sorted(
        k for k, r in records.items() if r.accepted
    )


def test_an_interrupted_run_keeps_what_finished_and_a_rerun_completes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands while textkit's model call is still thinking: the two attempts that
    finished are in the ledger and the dataset; the rerun runs textkit alone."""
    slow = {**SCRIPT_RULES}
    slow["truncate() returns strings longer"] = [
        ScriptedReply(content="Thinking...", delay_s=60.0),
        *SCRIPT_RULES["truncate() returns strings longer"],
    ]
    real_poll = Collector.poll
    interrupts: list[float] = []

    def poll(self: Collector) -> None:
        real_poll(self)
        if len(self.records) >= 2 and not interrupts:
            interrupts.append(time.monotonic())
            raise KeyboardInterrupt

    monkeypatch.setattr(Collector, "poll", poll)
    out = tmp_path / "out"
    started = time.monotonic()
    cut = generate(out, slow, attempts=1)
    assert interrupts and time.monotonic() - started < 50  # did not wait for the slow call
    assert cut.interrupted and cut.run == 1 and cut.submitted == 3
    assert sorted(r.repo for r in cut.recorded) == [LEDGER_REPO, SHOPCART_REPO]
    assert sorted(r.repo for r in read_ledger(out / LEDGER).values()) == [
        LEDGER_REPO,
        SHOPCART_REPO,
    ]
    assert {r["repo"] for r in lines(out / "dataset.jsonl")} == {LEDGER_REPO, SHOPCART_REPO}
    assert json.loads((out / "acceptance.json").read_text())["total"]["attempts"] == 2

    monkeypatch.setattr(Collector, "poll", real_poll)
    rest = generate(out, attempts=1)
    assert rest.run == 2 and rest.submitted == 1 and not rest.interrupted
    assert [(r.repo, r.attempt, r.status, r.accepted) for r in rest.recorded] == [
        (TEXTKIT_REPO, 0, SessionStatus.COMPLETED, False)
    ]
    assert len(read_ledger(out / LEDGER)) == 3


@pytest.mark.skipif(
    "pi" not in installed_names(default_prefix()) or shutil.which("bwrap") is None,
    reason="Pi is not installed (polar harness install pi) or bubblewrap is missing",
)
def test_pi_generates_the_same_dataset(tmp_path: Path) -> None:
    """The same run through Pi, a real coding-agent CLI, in bubblewrap: its bash tool makes
    the fixes, and only the two fixed instances are accepted."""
    run = generate(tmp_path / "out", script_rules("bash"), harness="pi", attempts=1)
    records = read_ledger(run.ledger)
    assert {r.repo: r.accepted for r in records.values()} == {
        LEDGER_REPO: True,
        SHOPCART_REPO: True,
        TEXTKIT_REPO: False,
    }, [r.error for r in records.values()]
    rows = lines(run.dataset.jsonl)
    assert {r["repo"] for r in rows} == {LEDGER_REPO, SHOPCART_REPO}
    for row in rows:
        calls = [c for m in row["messages"] for c in m.get("tool_calls") or []]
        assert calls and {c["function"]["name"] for c in calls} == {"bash"}
        assert "bash" in {t["function"]["name"] for t in row["tools"]}
        assert sum(row["assistant_masks"]) > 0
