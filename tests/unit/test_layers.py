"""The package tree is layered: schemas at the bottom, the two servers side by side, the
one-process stack above them, quickstart, generation, training and ray side by side on the
stack (never on each other or a server), the CLI on top.

Every ``import polar.x`` in ``src/polar`` (lazy imports inside functions included) is checked,
so a shortcut from one server into the other, or from a server up into the stack, fails here.
Inside the gateway, the proxy wing never imports the node wing (``gateway/node/``).
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
    # The floors the servers stand on, three of them: the wire shapes, the record store, the
    # sandboxes and the client first; what reads them (rendering, harnesses, evaluators, the
    # trajectory builders, SWE tasks) next; the engines and the turn rewards, which score with
    # an engine, last. A builder that reaches into an engine for a codec or a tokenizer fails.
    {"capture", "providers", "runtimes", "client"},
    {"rendering", "harnesses", "evaluators", "trajectory", "swe"},
    {"engines", "turn_rewards"},
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
    if path == SRC / "__init__.py":  # the public API's names for type checkers: never run
        tree.body = [node for node in tree.body if not _is_type_checking_block(node)]
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


def _is_type_checking_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


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


def _upward(package: str, imports: dict[str, list[str]]) -> dict[str, list[str]]:
    """The imported packages (with their importing files) on a higher layer than ``package``."""
    return {target: files for target, files in imports.items() if _layer(target) > _layer(package)}


@pytest.mark.parametrize("package", sorted(GRAPH))
def test_imports_only_its_own_layer_or_below(package: str) -> None:
    upward = _upward(package, GRAPH[package])
    assert not upward, f"polar.{package} imports upward: {upward}"


def test_the_sub_layers_refuse_a_builder_reaching_into_an_engine(tmp_path: Path) -> None:
    """The rule the one middle layer could not see: trajectory/ reading a codec or a tokenizer
    out of engines/ (as it once did) is an upward import now; its own floors are not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from polar.engines import routed_experts\n"
        "def later():\n    from polar.engines.model_files import load_tokenizer\n"
        "from polar.capture import routed_experts as codec\n"
        "from polar.rendering.model_files import load_tokenizer as tokenizer\n"
    )
    imports = {target: [probe.name] for target in _imported_packages(probe)}
    assert _upward("trajectory", imports) == {"engines": [probe.name]}
    assert _upward("engines", imports) == {}
    assert _upward("capture", imports) == {"engines": [probe.name], "rendering": [probe.name]}


@pytest.mark.parametrize(("a", "b"), APART)
def test_servers_do_not_import_each_other(a: str, b: str) -> None:
    assert b not in GRAPH[a], f"polar.{a} imports polar.{b}: {GRAPH[a][b]}"
    assert a not in GRAPH[b], f"polar.{b} imports polar.{a}: {GRAPH[b][a]}"


# The gateway's two wings: the proxy wing (gateway/'s own modules) never imports the node wing
# at run time, so a standalone gateway loads no runtime, harness or evaluator. Only the app
# factory attaches the node (lazily, on a rollout node); a type named for checkers is no import.
NODE_WING = "polar.gateway.node"
WIRES_BOTH_WINGS = {"gateway/app.py"}


def _runtime_imports(path: Path, package: str) -> set[str]:
    """Every ``polar`` module (or name in one) a file in ``package`` imports at run time:
    lazy and relative imports included, ``TYPE_CHECKING`` blocks left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {
        id(inner)
        for block in ast.walk(tree)
        if isinstance(block, ast.stmt) and _is_type_checking_block(block)
        for inner in ast.walk(block)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # ``from .x import y`` in ``package``; ``..`` is its parent
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*parts, module] if module else parts)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "polar"}


def _reaches_node_wing(modules: set[str]) -> set[str]:
    return {m for m in modules if m == NODE_WING or m.startswith(NODE_WING + ".")}


def test_the_proxy_wing_does_not_import_the_node_wing() -> None:
    proxy_wing = sorted((SRC / "gateway").glob("*.py"))
    assert len(proxy_wing) > 10 and (SRC / "gateway" / "node" / "lifecycle.py").is_file()
    reached = {
        rel: sorted(found)
        for path in proxy_wing
        if (rel := str(path.relative_to(SRC))) not in WIRES_BOTH_WINGS
        if (found := _reaches_node_wing(_runtime_imports(path, "polar.gateway")))
    }
    assert not reached, f"the proxy wing imports the node wing: {reached}"


def test_the_wing_checker_sees_a_violation(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from polar.gateway.node.lifecycle import Lifecycle\n"
        "def later():\n    from polar.gateway import node\n"
        "from .node import node_api\n"
        "from ..gateway.node import node_client\n"
        "import polar.gateway.node.executors\n"
        "from polar.gateway.sessions import SessionRegistry\n"
        "from polar.gateway import nodes\n"
        "if TYPE_CHECKING:\n    from polar.gateway.node.node_api import GatewayNode\n"
    )
    assert _reaches_node_wing(_runtime_imports(probe, "polar.gateway")) == {
        "polar.gateway.node.lifecycle.Lifecycle",
        "polar.gateway.node",
        "polar.gateway.node.node_api",
        "polar.gateway.node.executors",
        "polar.gateway.node.node_client",
    }
    assert "polar.node.node_api" in _runtime_imports(probe, "polar")  # ``.``: the file's package
    # The one exemption is real: the factory does attach the node wing.
    assert _reaches_node_wing(_runtime_imports(SRC / "gateway" / "app.py", "polar.gateway"))


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
