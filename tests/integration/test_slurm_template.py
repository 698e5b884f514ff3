"""Live smoke test of deploy/slurm/polar-ray.sbatch on a real Slurm: Debian's slurmctld and two
slurmd (n1, n2) on this host, munge on a private socket, nothing written to /etc (SLURM_CONF
points at a scratch file). The job starts Ray on both nodes, runs `polar ray up`, and its
POLAR_RUN runs one session, then waits like a long job until the test ends it the documented
way (scancel --batch --signal=TERM); the test reads what the job left behind.

Both Slurm nodes are one host, so each advertises its own loopback address (n1 127.0.0.11,
n2 127.0.0.12): a gateway URL on 127.0.0.12 is the proof that it runs on the non-head node,
and none of those URLs can come from a Slurm node name. Needs root (slurmd, apt-get); skips
saying why where Slurm cannot be had.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "slurm" / "polar-ray.sbatch"
PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")
DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/sbin/mungekey")
NODE_IPS = {"n1": "127.0.0.11", "n2": "127.0.0.12"}
BIN = Path(sys.executable).parent
RUNNING_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
LINGER_S = 6071  # POLAR_RUN's last step, a long job's stand-in; its command line is unique


def _slurm_missing() -> str | None:
    """Why Slurm cannot run here, after installing Debian's packages if they are missing."""
    if os.geteuid() != 0:
        return "slurmd and munged need root here (and installing Slurm needs apt-get as root)"
    if all(Path(p).exists() for p in DAEMONS) and shutil.which("sbatch"):
        return None
    if shutil.which("apt-get") is None:
        return "Slurm is not installed and there is no apt-get to install it"
    install = f"apt-get update -qq && apt-get install -y -qq {' '.join(PACKAGES)}"
    try:
        done = subprocess.run(
            ["bash", "-c", install], capture_output=True, text=True, timeout=300, check=False
        )
    except subprocess.TimeoutExpired:
        return f"installing Slurm ({install}) took over 300 s"
    if done.returncode != 0:
        return f"installing Slurm failed ({install}): {(done.stdout + done.stderr)[-300:]}"
    return None


def _free_port(count: int = 1) -> int:
    """A port p with p .. p+count-1 free on 127.0.0.1 right now."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count > 65535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError("no free port range")


SLURM_CONF = """\
ClusterName=polartest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n1_port} CPUs=1 RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n2_port} CPUs=1 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 30, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            list(args),
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return done.stdout

    def job_state(self, job_id: str) -> dict[str, str]:
        line = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(f.split("=", 1) for f in line.split() if "=" in f)


class _Daemons:
    """The daemons this test starts, in the foreground, so each one's pid is its own."""

    def __init__(self) -> None:
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], pid_file: Path) -> None:
        log = (pid_file.parent / f"{name}.out").open("wb")
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.started.append((name, process, pid_file))

    def stop(self) -> None:
        for _name, process, pid_file in reversed(self.started):
            # The pid file names the daemon we started (a foreground daemon writes its own pid).
            if pid_file.exists() and pid_file.read_text().strip() not in ("", str(process.pid)):
                raise AssertionError(f"{pid_file} names another process than ours")
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    reason = _slurm_missing()
    if reason:
        print(f"skipping the Slurm smoke test: {reason}")
        pytest.skip(reason)
    if shutil.which("ray", path=str(BIN)) is None:
        pytest.skip("Ray is not installed in this environment (pip install polar[ray])")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) not installed: the job's session runs in it")

    # Short: Ray puts Unix sockets under the job's temp dirs, and munged's socket lives here.
    root = Path(tempfile.mkdtemp(prefix="polar-slurm-", dir="/tmp"))
    for sub in ("munge", "state", "spool-n1", "spool-n2"):
        (root / sub).mkdir(mode=0o700)
    ports = {"ctld_port": _free_port(), "n1_port": _free_port(), "n2_port": _free_port()}
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(root=root, **ports))
    # test_ray_cluster sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 process-wide when it is
    # collected (before `import ray`); a joining `ray start --address` refuses to run with it.
    inherited = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env = {**inherited, "SLURM_CONF": str(conf), "PATH": f"{BIN}:{os.environ['PATH']}:/usr/sbin"}
    daemons = _Daemons()
    cluster = SlurmCluster(root, env)
    try:
        munge = root / "munge"
        subprocess.run(
            ["/usr/sbin/mungekey", "--create", f"--keyfile={munge / 'munge.key'}"],
            check=True,
            capture_output=True,
        )
        daemons.start(
            "munged",
            [
                "/usr/sbin/munged",
                "--foreground",
                "--force",
                f"--socket={munge / 'munge.sock'}",
                f"--key-file={munge / 'munge.key'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            env,
            munge / "munged.pid",
        )
        _wait(lambda: (munge / "munge.sock").exists(), 10, "munged's socket")
        daemons.start("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i"], env, root / "slurmctld.pid")
        for node in ("n1", "n2"):
            daemons.start(
                f"slurmd-{node}",
                ["/usr/sbin/slurmd", "-D", "-N", node],
                env,
                root / f"slurmd-{node}.pid",
            )
        _wait(lambda: _idle_nodes(cluster) == {"n1", "n2"}, 60, "n1 and n2 idle in sinfo")
        yield cluster
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
        daemons.stop()
        shutil.rmtree(root, ignore_errors=True)


def _idle_nodes(cluster: SlurmCluster) -> set[str]:
    try:
        out = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %t", timeout=10)
    except subprocess.SubprocessError:
        return set()
    return {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["idle"]}


def _wait(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s:g}s")
        time.sleep(0.3)


# The job's one session: the shell harness in bubblewrap makes one chat completion through its
# gateway (the scripted engine answers "Done.") and the evaluator checks the answer arrived.
CALL = textwrap.dedent(
    """\
    import json, os, urllib.request
    body = {"model": os.environ["POLAR_MODEL"],
            "messages": [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"})
    reply = json.load(urllib.request.urlopen(request, timeout=60))
    open("answer.txt", "w").write(reply["choices"][0]["message"]["content"])
    """
)

RUN_TASK = textwrap.dedent(
    """\
    import json, os, sys
    from polar.client import RolloutClient
    from polar.schemas.task import TaskRequest

    call, token_file, out = sys.argv[1:]
    task = TaskRequest.model_validate({
        "task_id": "slurm-smoke",
        "instruction": "Say done.",
        "num_samples": 1,
        "timeout_seconds": 90,
        "runtime": {"kind": "bubblewrap", "files": {"call.py": open(call).read()}},
        "agent": {"harness": "shell", "settings": {"command": "python3 call.py"}},
        "builder": {"strategy": "prefix_merging"},
        "evaluator": {"strategy": "test_on_output", "config": {"command": "grep -q Done answer.txt"}},
    })
    token = open(token_file).read().strip()
    with RolloutClient(os.environ["POLAR_ROLLOUT_URL"], token=token) as client:
        client.submit(task)
        result = client.wait([task.task_id], timeout_s=120)[task.task_id]
    open(out, "w").write(result.model_dump_json())
    """
)


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """The job's RAY_TMP: short, as Ray puts Unix sockets under it (107-byte paths)."""
    path = Path(tempfile.mkdtemp(prefix="psr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_template_starts_ray_and_polar_on_two_nodes(slurm: SlurmCluster, ray_tmp: Path) -> None:
    job_dir = slurm.root / "job"
    (slurm.root / "call.py").write_text(CALL)
    (slurm.root / "run_task.py").write_text(RUN_TASK)
    (slurm.root / "polar-ray.yaml").write_text(
        textwrap.dedent(
            f"""\
            rollout:
              port: 0
              data_dir: {slurm.root / "rollout"}
            defaults:
              runtime: bubblewrap
            ray:
              gateways:
                work_dir: {slurm.root / "gateways"}
            """
        )
    )
    status_file, result_file = slurm.root / "status.json", slurm.root / "result.json"
    ran = slurm.root / "ran"
    node_ip_cmd = "case $SLURMD_NODENAME in " + " ".join(
        f"{node}) echo {ip};;" for node, ip in NODE_IPS.items()
    )
    env = {
        **slurm.env,
        "POLAR_CONFIG": str(slurm.root / "polar-ray.yaml"),
        "POLAR": str(BIN / "polar"),
        "RAY": str(BIN / "ray"),
        "POLAR_WORK_DIR": str(job_dir),
        "POLAR_NODE_IP_CMD": node_ip_cmd + " esac",
        "POLAR_WAIT_S": "150",
        "RAY_PORT": str(_free_port()),
        "RAY_CLIENT_PORT": str(_free_port()),
        "RAY_AGENT_PORT": str(_free_port(count=2)),
        "RAY_TMP": str(ray_tmp),
        "RAY_START_ARGS": f"--object-store-memory={80 * 1024 * 1024}",
        "POLAR_RUN": f'"$POLAR" ray status --json > {status_file} && '
        f"{sys.executable} {slurm.root / 'run_task.py'} {slurm.root / 'call.py'} "
        f"{slurm.root / 'rollout' / 'rollout.token'} {result_file} && "
        f"touch {ran} && sleep {LINGER_S}",
    }
    output = slurm.root / "job.out"
    started = time.monotonic()
    job_id = slurm.run(
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--time=5",
        f"--output={output}",
        str(TEMPLATE),
        env=env,
    ).strip()
    try:
        _wait(lambda: ran.exists() or _finished(slurm, job_id), 240, "session run by the job")
        if not _finished(slurm, job_id):  # a job that ended early is shown below, not signalled
            slurm.run("scancel", "--batch", "--signal=TERM", job_id)
        state = _wait_job(slurm, job_id, timeout_s=60)
    finally:
        subprocess.run(["scancel", job_id], env=slurm.env, capture_output=True)
    log = output.read_text() if output.exists() else "(no job output)"
    print(f"job {job_id} took {time.monotonic() - started:.1f}s:\n{log}")
    for name in ("ray-n1.log", "ray-n2.log"):  # each node's Ray, when the job failed
        if state["JobState"] != "COMPLETED" and (job_dir / name).exists():
            print(f"--- {name}:\n{(job_dir / name).read_text()[-3000:]}")
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", (state, log)

    # Ray: the head on n1, the gateway node on n2, each with its own address.
    ray_port = env["RAY_PORT"]
    assert f"head n1 (127.0.0.11:{ray_port}), gateway nodes: n2" in log
    assert "Local node IP: 127.0.0.11" in (job_dir / "ray-n1.log").read_text()
    assert "Local node IP: 127.0.0.12" in (job_dir / "ray-n2.log").read_text()

    # polar ray up: the rollout server on the head, one gateway on n2, registered and healthy
    # with a real URL.
    status = json.loads(status_file.read_text())
    assert urlsplit(status["rollout_url"]).hostname == "127.0.0.11"
    [node] = status["nodes"]
    url = urlsplit(node["url"])
    assert url.hostname == "127.0.0.12" and url.port and url.port > 0, node
    assert node["healthy"] and not node["dead"], node
    assert f"polar up: rollout server {status['rollout_url']}, 1 gateways" in log

    # The session ran on that gateway; its model call's sampled tokens, with their logprobs,
    # are the trace's trainable part.
    result = json.loads(result_file.read_text())
    assert result["status"] == "COMPLETED", result
    [session] = result["results"]
    assert session["status"] == "COMPLETED", session
    assert session["node_id"] == node["node_id"] and session["reward"] == 1.0
    [trace] = session["trajectory"]["traces"]
    assert trace["response_ids"] and trace["prompt_ids"] and all(trace["loss_mask"])
    assert len(trace["response_logprobs"]) == len(trace["response_ids"])

    # The end: Polar's actors killed by polar ray down, the Ray processes of this job gone.
    [killed] = [line for line in log.splitlines() if line.startswith("killed: ")]
    gateway_actor = "polar-gw-" + node["node_id"].removeprefix("ray-")
    assert set(killed.removeprefix("killed: ").split(", ")) == {"polar-rollout", gateway_actor}
    assert "polar-ray: SIGTERM: shutting down" in log
    assert "ray stopped on n1 n2; exit 0" in log
    assert not _processes_under(ray_tmp), "Ray processes of the job survived it"
    assert not _processes_under(f"sleep {LINGER_S}"), "POLAR_RUN survived the job"
    with pytest.raises(httpx.TransportError):
        httpx.get(node["url"] + "/health", timeout=2)


def _finished(slurm: SlurmCluster, job_id: str) -> bool:
    return slurm.job_state(job_id)["JobState"] not in RUNNING_STATES


def _wait_job(slurm: SlurmCluster, job_id: str, timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        state = slurm.job_state(job_id)
        if state["JobState"] not in RUNNING_STATES:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {state['JobState']} after {timeout_s:g}s")
        time.sleep(0.5)


def _processes_under(mark: Path | str) -> list[str]:
    """Command lines of live processes that mention ``mark`` (say, the job's Ray temp dirs)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(mark) in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found
