"""Benchmark what a SWE session costs besides the agent: laying its workspace down at INIT and
grading it afterwards, on the bundled tasks in bubblewrap.

1. ``checkout``: the host-side checkout of a bundle at its base commit, cold (an empty cache:
   unbundle, prune, check out) and warm (the cached tree is found);
2. ``start``: a bubblewrap runtime whose ``source`` is that checkout, started (the tree copied
   into the session's workspace, the sandbox probed): what every session pays at INIT;
3. ``grade``: ``swe_tests`` on a workspace holding the gold patch (a fresh runtime started, the
   diff applied minus tests, the test patch applied with git inside, pytest run and parsed,
   swebench's grading), and on an untouched workspace (no change: the tests are not run).

    python bench/swe_workspaces.py            # ~1 min
    python bench/swe_workspaces.py --repeat 3
    python bench/swe_workspaces.py --smoke    # one task, once (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from polar.evaluators.base import EvaluationContext
from polar.evaluators.registry import create_evaluator
from polar.runtimes.base import Runtime
from polar.runtimes.bubblewrap import BubblewrapRuntime
from polar.runtimes.checkouts import checkout
from polar.schemas.task import EvaluatorSpec, GitSource, RuntimeSpec, TaskRequest
from polar.schemas.trajectory import Trajectory, TrajectoryStatus
from polar.swe.bundled import bundle_repos, bundled_instances
from polar.swe.instances import SWEInstance
from polar.swe.tasks import SWETaskOptions, instance_task


def timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


async def timed_async(fn: Callable[[], Awaitable[object]]) -> float:
    began = time.perf_counter()
    await fn()
    return time.perf_counter() - began


def runtime_for(instance: SWEInstance, bundle: Path, session_dir: Path) -> Runtime:
    source = GitSource(kind="git", repo=str(bundle), commit=instance.base_commit)
    return BubblewrapRuntime(RuntimeSpec(source=source), session_dir, "http://127.0.0.1:9")


async def grade(
    instance: SWEInstance, task: TaskRequest, bundle: Path, work: Path, fix: bool
) -> float:
    agent = runtime_for(instance, bundle, work / "agent")
    await agent.start()
    if fix:
        subprocess.run(
            ["git", "apply"], input=instance.patch, text=True, cwd=agent.workspace_path, check=True
        )
    spec = EvaluatorSpec.model_validate(task.evaluator.model_dump())
    evaluator = create_evaluator(spec)
    count = iter(range(100))
    ctx = EvaluationContext(
        runtime=agent,
        trajectory=Trajectory(status=TrajectoryStatus.COMPLETED),
        task=task,
        workspace=await agent.workspace_snapshot(),
        fresh_runtime=lambda: runtime_for(instance, bundle, work / f"fresh{next(count)}"),
    )
    try:
        began = time.perf_counter()
        result = await evaluator.evaluate(ctx)
        elapsed = time.perf_counter() - began
    finally:
        await agent.stop()
    assert result.passed is fix, (instance.instance_id, result.details.get("reason"))
    return elapsed


async def main_async(repeat: int, tasks: int | None = None) -> dict[str, list[float]]:
    """Each bundled task (the first ``tasks`` of them) ``repeat`` times."""
    times: dict[str, list[float]] = {k: [] for k in ("cold", "warm", "start", "gold", "empty")}
    with tempfile.TemporaryDirectory(prefix="polar-bench-swe-") as tmp:
        root = Path(tmp)
        bundles = bundle_repos(root / "repos")
        options = SWETaskOptions(
            runtime="bubblewrap", repos={k: str(v) for k, v in bundles.items()}
        )
        for r in range(repeat):
            for instance in bundled_instances()[:tasks]:
                bundle = bundles[instance.repo]
                cache = root / f"cache-{r}-{instance.instance_id}"
                fetch = partial(checkout, str(bundle), instance.base_commit, cache)
                times["cold"].append(timed(fetch))
                times["warm"].append(timed(fetch))
                work = root / f"run-{r}-{instance.instance_id}"
                rt = runtime_for(instance, bundle, work / "start")
                times["start"].append(await timed_async(rt.start))
                await rt.stop()
                task = instance_task(instance, options)
                times["gold"].append(await grade(instance, task, bundle, work / "gold", fix=True))
                times["empty"].append(
                    await grade(instance, task, bundle, work / "empty", fix=False)
                )
                shutil.rmtree(work, ignore_errors=True)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one task, once (CI)")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        print("bubblewrap is not installed", file=sys.stderr)
        return 1
    times = asyncio.run(main_async(1 if args.smoke else args.repeat, 1 if args.smoke else None))
    labels = {
        "cold": "checkout, cold cache",
        "warm": "checkout, cached",
        "start": "bubblewrap start with the checkout copied in",
        "gold": "swe_tests, gold patch (resolved)",
        "empty": "swe_tests, no change (not resolved)",
    }
    print(f"{'step':48} {'median':>8} {'min':>8} {'max':>8}   (seconds, n={len(times['cold'])})")
    for key, label in labels.items():
        values = times[key]
        print(f"{label:48} {statistics.median(values):8.3f} {min(values):8.3f} {max(values):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
