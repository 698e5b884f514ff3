"""The package tree is layered: schemas at the bottom, the two servers side by side, the
one-process stack above them, quickstart, generation, training and ray side by side on the
stack (never on each other or a server), the CLI on top.

Every ``import polar.x`` in ``src/polar`` (lazy imports inside functions included) is checked,
so a shortcut from one server into the other, or from a server up into the stack, fails here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import polar
from polar.schemas.task import EvaluationSummary, SessionResult
from polar.schemas.trajectory import Trace, TraceStats, Trajectory, TrajectoryStats

SRC = Path(polar.__file__).parent

# Lowest first. A package may import packages of its own layer or of layers below.
LAYERS: list[set[str]] = [
    {
        "polar",
        "errors",
        "registry",
        "config_loader",
        "delivery",
        "extras",
        "schemas",
        "tokens",
        "auth",
        "serving",
        "logs",
    },
    {
        "providers",
        "rendering",
        "engines",
        "capture",
        "trajectory",
        "evaluators",
        "runtimes",
        "harnesses",
        "client",
        "swe",
        "turn_rewards",
    },
    {"gateway", "rollout"},
    {"stack"},
    {"training", "quickstart", "generation", "ray"},
    {"cli"},
]
# Same layer, yet they must not know each other: they talk only over HTTP, through schemas/.
APART = [("gateway", "rollout")]
# Above the servers, side by side on stack/ (the one home of a run on this machine): each stands
# on the stack alone, never on another of them nor on a server directly.
ON_THE_STACK = ("quickstart", "generation", "training", "ray")
SERVERS = ("gateway", "rollout")


def _layer(package: str) -> int:
    for index, members in enumerate(LAYERS):
        if package in members:
            return index
    raise AssertionError(f"polar.{package} is in no layer: add it to LAYERS in {__file__}")


def _package_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return "polar" if parts == ("__init__",) else parts[0]


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = (
                [f"polar.{alias.name}" for alias in node.names]
                if node.module == "polar"
                else [node.module]
            )
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "polar":
                continue
            sub = parts[1] if len(parts) > 1 else "polar"
            found.add(sub if (SRC / sub).is_dir() or (SRC / f"{sub}.py").exists() else "polar")
    return found


def _graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the files that import it."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(SRC.rglob("*.py")):
        source = _package_of(path)
        for target in _imported_packages(path):
            if target != source:
                graph[source][target].append(str(path.relative_to(SRC)))
    return graph


GRAPH = _graph()


@pytest.mark.parametrize("package", sorted(GRAPH))
def test_imports_only_its_own_layer_or_below(package: str) -> None:
    upward = {
        target: files
        for target, files in GRAPH[package].items()
        if _layer(target) > _layer(package)
    }
    assert not upward, f"polar.{package} imports upward: {upward}"


@pytest.mark.parametrize(("a", "b"), APART)
def test_servers_do_not_import_each_other(a: str, b: str) -> None:
    assert b not in GRAPH[a], f"polar.{a} imports polar.{b}: {GRAPH[a][b]}"
    assert a not in GRAPH[b], f"polar.{b} imports polar.{a}: {GRAPH[b][a]}"


def _off_limits(package: str) -> set[str]:
    """What a package on the stack must not import: its neighbours and the servers."""
    return (set(ON_THE_STACK) - {package}) | set(SERVERS)


@pytest.mark.parametrize("package", ON_THE_STACK)
def test_the_top_floor_stands_on_the_stack_alone(package: str) -> None:
    reached = {t: files for t, files in GRAPH[package].items() if t in _off_limits(package)}
    assert not reached, f"polar.{package} reaches past the stack: {reached}"


def test_the_stack_checker_sees_a_violation(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from polar.stack.run import LocalRun\n"
        "def later():\n    from polar.generation.run import run_generate\n"
        "from polar.gateway.config import GatewayConfig\n"
    )
    imported = _imported_packages(probe)
    assert imported & _off_limits("training") == {"generation", "gateway"}
    assert "stack" not in _off_limits("training") and "training" not in _off_limits("training")


def test_no_cycles_between_packages() -> None:
    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(GRAPH[start])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(GRAPH.get(node, {}))
        return seen

    cycles = sorted(p for p in GRAPH if p in reach(p))
    assert not cycles, f"packages on an import cycle: {cycles} " + str(
        {p: sorted(GRAPH[p]) for p in cycles}
    )


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The scan itself works: an upward import written to a file is found."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import polar.capture.store\n"
        "def later():\n    from polar.rollout.service import RolloutService\n"
        "from polar import errors\n"
    )
    assert _imported_packages(probe) == {"capture", "rollout", "errors"}
    assert _layer("rollout") > _layer("capture") > _layer("errors")


# Builtin exception bases: a class on these alone, outside errors.py, escapes PolarError.
_BUILTIN_ERRORS = {
    "Exception",
    "BaseException",
    "ValueError",
    "OSError",
    "TimeoutError",
    "RuntimeError",
    "KeyError",
    "LookupError",
}
# Packages whose own exceptions never leave a process: the CLI's stop signal.
_OWN_EXCEPTIONS = {"cli"}


def _escaping_exceptions() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "errors.py" and path.parent == SRC:
            continue
        if _package_of(path) in _OWN_EXCEPTIONS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if bases and bases <= _BUILTIN_ERRORS:  # no Polar base among them
                found.append(f"{path.relative_to(SRC)}:{node.name}")
    return found


def test_every_public_exception_is_a_polar_error_in_errors_py() -> None:
    """Exceptions live in errors.py under PolarError (with their HTTP status); a module that
    raises one re-exports it by importing it, never by defining its own."""
    assert not _escaping_exceptions(), _escaping_exceptions()


def test_the_exception_checker_sees_a_violation(tmp_path: Path) -> None:
    from polar import errors

    assert issubclass(errors.UnsafeFile, OSError) and issubclass(
        errors.UnsafeFile, errors.PolarError
    )
    assert errors.TaskConflict.status == 409 and errors.NodeDraining.status == 503
    tree = ast.parse("class Bad(ValueError):\n    pass\n")
    bases = {
        b.id
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef)
        for b in n.bases
        if isinstance(b, ast.Name)
    }
    assert bases <= _BUILTIN_ERRORS


# Contracts live in schemas/: the record flags, the model-file cache place, the sampling policy.
_CONSTANT_SOURCES = ("polar.engines",)
_ABOVE_THE_SERVERS = {"training", "generation", "quickstart", "ray"}


def _named_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from polar.x import name`` in a file, lazy ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
        for alias in node.names
        if node.module.startswith("polar.")
    ]


def _is_contract(name: str) -> bool:
    return name.isupper() or name == "cache_dir"


def _contract_reaches() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        package = _package_of(path)
        for module, name in _named_imports(path):
            below_stack = _layer(package) < _layer("stack") and package != "engines"
            if below_stack and module.startswith(_CONSTANT_SOURCES) and _is_contract(name):
                found.append(f"{path.relative_to(SRC)}: {name} from {module}")
            gateway_policy = name == "SamplingPolicy" and module != "polar.schemas.sampling"
            if gateway_policy and package in _ABOVE_THE_SERVERS:
                found.append(f"{path.relative_to(SRC)}: SamplingPolicy from {module}")
    return found


def test_contracts_come_from_schemas() -> None:
    """Flags, the cache place and the sampling policy are read from schemas/, never from the
    engine or the gateway that happen to use them."""
    assert not _contract_reaches(), _contract_reaches()


def test_the_contract_checker_sees_a_violation(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from polar.engines.types import FLAG_ABORTED\n"
        "def later():\n    from polar.gateway.config import SamplingPolicy\n"
    )
    assert _named_imports(probe) == [
        ("polar.engines.types", "FLAG_ABORTED"),
        ("polar.gateway.config", "SamplingPolicy"),
    ]
    assert _is_contract("FLAG_ABORTED") and _is_contract("cache_dir")
    assert not _is_contract("load_tokenizer")


LONGEST = 600
# Over LONGEST lines and not yet split or justified by their owners: remove one from here when
# it is (the list only shrinks).
_LONG_PENDING: set[str] = set()


def test_no_module_is_over_600_lines_unless_it_says_why_it_stays_whole() -> None:
    """A long module either splits or says in its docstring that it reads better whole."""
    long = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(SRC))
        if text.count("\n") <= LONGEST or rel in _LONG_PENDING:
            continue
        if "reads better whole" not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(f"{rel} ({text.count(chr(10))} lines)")
    assert not long, f"split these or say why they read better whole: {long}"


def test_no_trainer_or_exporter_reads_a_session_fact_by_string_key() -> None:
    """Polar's own facts about a session (the builder's stats, lineage, masks, turn rewards,
    the evaluation, the sample index) are read as types (``trace.stats``, ``result.passed``,
    ...), never as ``x.metadata["key"]``: a string key hides a typo and a second default.
    ``metadata`` keeps only the user's own keys (a task's ``solution``, ``kind``)."""
    typed = (TraceStats, TrajectoryStats, Trace, Trajectory, SessionResult, EvaluationSummary)
    facts = {name for model in typed for name in model.model_fields} - {"metadata"}

    def is_metadata(node: ast.expr, aliases: set[str]) -> bool:
        if isinstance(node, ast.BoolOp):  # ``x.metadata or {}``
            return any(is_metadata(value, aliases) for value in node.values)
        return (isinstance(node, ast.Attribute) and node.attr == "metadata") or (
            isinstance(node, ast.Name) and node.id in aliases
        )

    def string_key_reads(source: str) -> list[str]:
        tree = ast.parse(source)
        aliases = {  # ``meta = trace.metadata`` and its reads later
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and is_metadata(node.value, set())
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                owner, key = node.value, node.slice
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "pop", "setdefault")
                and node.args
            ):
                owner, key = node.func.value, node.args[0]
            else:
                continue
            if isinstance(key, ast.Constant) and key.value in facts and is_metadata(owner, aliases):
                found.append(f"line {node.lineno}: {key.value!r}")
        return found

    planted = (
        "a = trace.metadata['num_calls']\nb = (r.metadata or {}).get('evaluation')\n"
        "m = t.metadata\nc = m.get('break_reason')\nd = task.metadata['solution']\n"
        "trace.metadata['trainable'] = False\n"
    )
    assert string_key_reads(planted) == [
        "line 1: 'num_calls'", "line 2: 'evaluation'", "line 4: 'break_reason'",
    ]  # fmt: skip
    readers = [*(SRC / "training").rglob("*.py"), *(SRC / "trajectory" / "exporters").glob("*.py")]
    reads = {
        str(path.relative_to(SRC)): found
        for path in sorted(readers)
        if (found := string_key_reads(path.read_text()))
    }
    assert not reads, f"read these through the typed views instead: {reads}"
