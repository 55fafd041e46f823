"""Import and exit boundaries of ``analyzer/`` and ``reference_server/``, read from the AST.

Every ``.py`` file of both packages is parsed (nothing is imported, so this runs in well under a
second); imports inside functions and ``TYPE_CHECKING`` blocks count, relative imports are
resolved against the file's package, and ``importlib.import_module("...")`` / ``__import__`` with
a literal name count as imports.

Boundaries (the project's style guide, "Shape": "Heavy or process-wide imports stay in one
place"):

- ``optuna`` is imported only by ``analyzer/search/study.py``, the search module.
- ``locust`` and ``gevent`` (process-wide monkey patching) only under ``analyzer/load/``.
- ``onnxruntime`` only by ``reference_server/backends/onnxruntime.py``; ``onnx`` (the graph
  builder, no runtime) only by the bundled-model builders in ``reference_server/zoo/``.
- ``reference_server`` never imports ``analyzer`` (the server stands alone).
- ``reference_server/core/`` and ``reference_server/batching/`` import no
  ``reference_server.frontends`` module and not ``reference_server.app`` (frontends call the
  core, never the other way round).
- ``analyzer/`` is layered (:data:`LAYERS`, lowest first; ``docs/internals.md`` draws it): a
  module imports nothing of a layer above its own; modules of one layer may import each other.
  One rule per layer; every ``analyzer`` module lies in exactly one layer, and each package's
  ``__init__`` docstring names its layer. Imports under ``TYPE_CHECKING`` do not count here (they
  never run: ``config/objective.py`` names the records it ranks in annotations only); imports
  inside functions do.
- A private name (``_x``) or private module is used only inside its package and the packages
  within it (:func:`private_crossings`).
- No import cycles among the modules of both packages: each module imports only what sits
  below it (:func:`test_no_import_cycles` says which imports count).

No ``sys.exit`` / ``exit`` / ``quit`` / ``os._exit`` / ``raise SystemExit`` and no ``print(``
below the CLI. The CLI edge is exactly:

- ``analyzer/cli.py`` and every module under ``analyzer/commands/`` (the typer layer);
- ``reference_server/__main__.py`` (``python -m reference_server``);
- the function ``run_server`` in ``reference_server/app.py``, which prints the ready line
  (its stdout protocol; ``serve`` and ``ServerThread`` take an ``on_ready`` callback instead);
- in ``analyzer/load/web/extension.py``, the Locust plugin that is the CLI edge of the ``locust``
  process: ``_announce`` prints the dashboard's ready line, and ``_check_exposure`` calls
  ``sys.exit(2)`` because Locust logs and swallows any ``Exception`` an ``init`` listener
  raises (``locust.event.EventHook.fire``), so exiting is the only way to refuse to serve;
- a module's ``if __name__ == "__main__":`` block and the functions it calls by name (e.g.
  ``main`` of ``python -m reference_server.zoo.resnet50``): that is a command line of its own.

One exit is not a CLI's: ``analyzer/target/supervise.py``'s ``die_with_parent`` runs in a forked
child between fork and exec (``preexec_fn``) and calls ``os._exit`` there: it ends that child
only.

Everything else is library code: it returns or raises, and the CLI maps that to output and an
exit code. :data:`KNOWN_VIOLATIONS` lists what breaks a boundary today (reported, owned by
others); a test fails once one of them is fixed, so the list shrinks with the code.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("analyzer", "reference_server")


@dataclass(frozen=True)
class Finding:
    """One import or call found in a file: ``path`` relative to the scanned root."""

    path: str
    line: int
    function: str  # the innermost enclosing def ("" at module level)
    what: str  # a module name ("optuna.trial") or a call ("print", "sys.exit")
    scope: tuple[str, ...] = ()  # every enclosing def, outermost first
    main_guard: bool = False  # inside ``if __name__ == "__main__":``
    type_checking: bool = False  # inside ``if TYPE_CHECKING:`` (never executed)
    from_base: bool = False  # the ``X`` of ``from X import a, b`` (also found as ``X.a``, ``X.b``)

    def __str__(self) -> str:
        where = f" in {self.function}()" if self.function else ""
        return f"{self.path}:{self.line}{where}: {self.what}"


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(relative: Path, level: int, module: str | None) -> str:
    """The absolute module of ``from <level dots><module> import ...`` in ``relative``."""
    package = _module_name(relative).split(".")
    if relative.name != "__init__.py":
        package.pop()  # a module's package is its parent
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, module] if module else base)


class _Scanner(ast.NodeVisitor):
    def __init__(self, relative: Path) -> None:
        self.relative = relative
        self.functions: list[str] = []
        self.in_main_guard = False
        self.in_type_checking = False
        self.entry_points: set[str] = set()  # functions the ``__main__`` block calls
        self.imports: list[Finding] = []
        self.exits: list[Finding] = []
        self.prints: list[Finding] = []

    def _found(self, node: ast.AST, what: str, from_base: bool = False) -> Finding:
        function = self.functions[-1] if self.functions else ""
        line = getattr(node, "lineno", 0)
        path = self.relative.as_posix()
        scope = tuple(self.functions)
        guarded, typing = self.in_main_guard, self.in_type_checking
        return Finding(path, line, function, what, scope, guarded, typing, from_base)

    def visit_If(self, node: ast.If) -> None:
        if _dotted(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            outer, self.in_type_checking = self.in_type_checking, True
            for statement in node.body:
                self.visit(statement)
            self.in_type_checking = outer
            for statement in node.orelse:
                self.visit(statement)
            return
        if not self.functions and _is_main_guard(node.test):
            self.in_main_guard = True
            for statement in node.body:
                self.visit(statement)
                self.entry_points |= {
                    _dotted(call.func) for call in ast.walk(statement) if isinstance(call, ast.Call)
                }
            self.in_main_guard = False
            for statement in node.orelse:
                self.visit(statement)
            return
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_Import(self, node: ast.Import) -> None:
        self.imports += [self._found(node, alias.name) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        relative = node.level > 0
        base = _resolve(self.relative, node.level, node.module) if relative else node.module or ""
        self.imports.append(self._found(node, base, from_base=True))
        # ``from reference_server import frontends`` imports the submodule too.
        self.imports += [self._found(node, f"{base}.{alias.name}") for alias in node.names]

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id == "SystemExit":
            self.exits.append(self._found(node, "raise SystemExit"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        if name == "print":
            self.prints.append(self._found(node, "print"))
        elif name in ("sys.exit", "exit", "quit", "os._exit"):
            self.exits.append(self._found(node, name))
        elif name in ("importlib.import_module", "import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self.imports.append(self._found(node, first.value))
        self.generic_visit(node)


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def scan(root: Path) -> list[_Scanner]:
    """Parse every ``.py`` file of :data:`PACKAGES` below ``root``."""
    scanners = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            scanner = _Scanner(relative)
            scanner.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
            scanners.append(scanner)
    return scanners


def _under(path: str, *prefixes: str) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def _imports(module: str, name: str) -> bool:
    return name == module or name.startswith(module + ".")


@dataclass(frozen=True)
class ImportRule:
    """``modules`` may be imported only by files under ``allowed`` (paths or folders)."""

    modules: tuple[str, ...]
    allowed: tuple[str, ...]
    importers: tuple[str, ...] = PACKAGES  # the files the rule applies to
    runtime_only: bool = False  # imports under ``if TYPE_CHECKING:`` do not count

    def violations(self, scanners: list[_Scanner]) -> list[Finding]:
        return [
            found
            for scanner in scanners
            if _under(scanner.relative.as_posix(), *self.importers)
            and not _under(scanner.relative.as_posix(), *self.allowed)
            for found in scanner.imports
            if not (self.runtime_only and found.type_checking)
            and any(_imports(module, found.what) for module in self.modules)
        ]


#: The layers of ``analyzer/``, lowest first: (name, the files and folders it holds). A module
#: may import its own layer and those below; ``docs/internals.md`` draws the same order.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors, documents", ("analyzer/__init__.py", "analyzer/errors.py", "analyzer/documents.py")),
    ("measure", ("analyzer/measure",)),
    ("config", ("analyzer/config",)),
    ("rundir", ("analyzer/rundir",)),
    ("target", ("analyzer/target",)),
    ("load", ("analyzer/load",)),
    ("evaluation", ("analyzer/evaluation",)),
    ("predict, search", ("analyzer/predict", "analyzer/search")),
    ("report, gate", ("analyzer/report", "analyzer/gate")),
    ("sweep", ("analyzer/sweep",)),
    ("commands, cli", ("analyzer/commands", "analyzer/cli.py")),
)


def _dotted_path(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def layer_rules() -> dict[str, ImportRule]:
    """One rule per layer with a layer above it: its files import no module of those above."""
    rules = {}
    for n, (name, paths) in enumerate(LAYERS[:-1]):
        above = tuple(_dotted_path(p) for _, higher in LAYERS[n + 1 :] for p in higher)
        rules[f"layer {name} imports nothing above it"] = ImportRule(
            above, (), importers=paths, runtime_only=True
        )
    return rules


IMPORT_RULES: dict[str, ImportRule] = {
    "optuna only in the search module": ImportRule(("optuna",), ("analyzer/search/study.py",)),
    "locust and gevent only under analyzer/load": ImportRule(
        ("locust", "gevent"), ("analyzer/load",)
    ),
    "onnxruntime only in its backend": ImportRule(
        ("onnxruntime",), ("reference_server/backends/onnxruntime.py",)
    ),
    "onnx only in the zoo builders": ImportRule(("onnx",), ("reference_server/zoo",)),
    "reference_server never imports analyzer": ImportRule(
        ("analyzer",), (), importers=("reference_server",)
    ),
    "core and batching import no frontend": ImportRule(
        ("reference_server.frontends", "reference_server.app"),
        (),
        importers=("reference_server/core", "reference_server/batching"),
    ),
    **layer_rules(),
}

#: (path, function or "" for any) where a call is part of the CLI edge (module docstring).
CLI_EDGE: dict[str, tuple[tuple[str, str], ...]] = {
    "print": (
        ("analyzer/cli.py", ""),
        ("analyzer/commands", ""),
        ("reference_server/__main__.py", ""),
        ("reference_server/app.py", "run_server"),
        ("analyzer/load/web/extension.py", "_announce"),
    ),
    "exit": (
        ("analyzer/cli.py", ""),
        ("analyzer/commands", ""),
        ("reference_server/__main__.py", ""),
        ("analyzer/load/web/extension.py", "_check_exposure"),
        ("analyzer/target/supervise.py", "die_with_parent"),
    ),
}

#: Library code that crosses a boundary today: (kind, path, function) -> why it is listed. Empty:
#: the last entry (``run_ui``'s status prints) went when the launcher got an ``on_status``.
KNOWN_VIOLATIONS: dict[tuple[str, str, str], str] = {}


def _within_edge(found: Finding, edge: tuple[tuple[str, str], ...], entry: set[str]) -> bool:
    if found.main_guard or (found.scope and found.scope[0] in entry):
        return True
    return any(
        _under(found.path, path) and (not function or function in found.scope)
        for path, function in edge
    )


def call_violations(scanners: list[_Scanner], kind: str) -> list[Finding]:
    """``print`` or exit calls outside :data:`CLI_EDGE` (``kind`` is ``"print"``/``"exit"``)."""
    return [
        found
        for scanner in scanners
        for found in (scanner.prints if kind == "print" else scanner.exits)
        if not _within_edge(found, CLI_EDGE[kind], scanner.entry_points)
    ]


def _unknown(kind: str, findings: list[Finding]) -> list[str]:
    return [str(f) for f in findings if (kind, f.path, f.function) not in KNOWN_VIOLATIONS]


#: module -> {module it imports: the first import of it found (file and line)}.
ImportGraph = dict[str, dict[str, Finding]]


def _owner(name: str, modules: set[str]) -> str | None:
    """The module ``name`` lies in: itself, or the longest module prefix of ``name`` (the
    ``pkg.mod`` of ``pkg.mod.name`` when ``name`` is a class or function); None outside."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> ImportGraph:
    """The import graph of :data:`PACKAGES` below ``root``: an edge for every import that runs,
    at module level or in a function, to a module of either package (rules: see
    :func:`test_no_import_cycles`)."""
    scanners = scan(root)
    modules = {_module_name(s.relative) for s in scanners}
    graph: ImportGraph = {module: {} for module in sorted(modules)}
    for scanner in scanners:
        importer = _module_name(scanner.relative)
        for found in scanner.imports:
            if found.type_checking or found.from_base:
                continue
            imported = _owner(found.what, modules)
            if imported is not None and imported != importer:
                graph[importer].setdefault(imported, found)
    return graph


def import_cycles(graph: ImportGraph) -> list[list[str]]:
    """One cycle per strongly connected group of modules, as ``[a, b, ..., a]``: the shortest
    one through the group's first module (by name), so the report is the same on every run."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for module in graph:
        if module not in index:
            visit(module)
    return sorted(_shortest_cycle(graph, group) for group in groups)


def _shortest_cycle(graph: ImportGraph, group: set[str]) -> list[str]:
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    for module in queue:  # breadth first, inside the group
        for imported in sorted(graph[module]):
            if imported == start:
                return [*paths[module], start]
            if imported in group and imported not in paths:
                paths[imported] = [*paths[module], imported]
                queue.append(imported)
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def cycle_report(graph: ImportGraph) -> str:
    """Every cycle of ``graph``, one line per import on it; ``""`` when there is none."""
    lines = []
    for cycle in import_cycles(graph):
        lines.append(" -> ".join(cycle))
        lines += [f"    {a} -> {b}: {graph[a][b]}" for a, b in itertools.pairwise(cycle)]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def scanners() -> list[_Scanner]:
    return scan(REPO_ROOT)


def test_the_scan_reads_both_packages(scanners: list[_Scanner]) -> None:
    paths = {s.relative.as_posix() for s in scanners}
    assert {"analyzer/search/study.py", "reference_server/core/server.py"} <= paths
    assert len(paths) > 40
    # The allowed importers still exist and still import what they are allowed to.
    searched = next(s for s in scanners if s.relative.as_posix() == "analyzer/search/study.py")
    assert any(_imports("optuna", f.what) for f in searched.imports)


@pytest.mark.parametrize("rule", list(IMPORT_RULES), ids=list(IMPORT_RULES))
def test_import_boundary(scanners: list[_Scanner], rule: str) -> None:
    found = IMPORT_RULES[rule].violations(scanners)
    assert not found, f"{rule}:\n" + "\n".join(str(f) for f in found)


@pytest.mark.parametrize("kind", ["print", "exit"])
def test_no_print_or_exit_below_the_cli(scanners: list[_Scanner], kind: str) -> None:
    unknown = _unknown(kind, call_violations(scanners, kind))
    assert not unknown, f"{kind} below the CLI edge (see this module's docstring):\n" + "\n".join(
        unknown
    )


def test_known_violations_are_still_there(scanners: list[_Scanner]) -> None:
    """Once a listed violation is fixed, its entry must go (the list only shrinks)."""
    present = {
        (kind, f.path, f.function)
        for kind in ("print", "exit")
        for f in call_violations(scanners, kind)
    }
    fixed = [f"{key}: {why}" for key, why in KNOWN_VIOLATIONS.items() if key not in present]
    assert not fixed, "fixed, remove from KNOWN_VIOLATIONS:\n" + "\n".join(fixed)


def test_no_import_cycles() -> None:
    """No module of ``analyzer/`` or ``reference_server/`` imports, directly or through others,
    a module that imports it: each sits above what it imports, and can be imported first.

    What counts as an import of module ``m`` by module ``n`` (an edge ``n -> m``):

    - ``import m`` and ``from m import name`` at module level, in a function (a lazy import runs
      when the function does: hiding a cycle there keeps the cycle), or in a ``__main__``
      block; relative imports resolved; ``importlib.import_module("m")`` with a literal name;
    - ``from pkg import name``: an edge to ``pkg.name`` when that is a module, else to
      ``pkg`` (a package's ``__init__`` is a module like any other; ``reference_server``'s
      lazy ``__getattr__`` imports are edges from it);
    - not an import under ``if TYPE_CHECKING:``: it never runs. It cannot hide a runtime cycle
      either: a name imported only there is unbound at run time, so code that uses the module
      at run time imports it again outside the block, and that import counts;
    - not the parent packages that Python initialises before ``pkg.mod`` (every ``__init__``
      that re-exports its own modules would otherwise form a cycle with them), and not a name
      computed at run time (``backends/registry``'s table of ``"module:Class"`` strings: the
      modules it names build on ``backends/base``, never on the registry).
    """
    graph = import_graph(REPO_ROOT)
    # The graph sees what it should: module-level, lazy (in a function) and TYPE_CHECKING imports.
    assert "analyzer.rundir.records" in graph["analyzer.rundir.results"]
    assert "analyzer.config.urls" in graph["analyzer.commands.load"]  # inside a function
    assert "analyzer.rundir.records" not in graph["analyzer.config.objective"]  # annotations only
    report = cycle_report(graph)
    assert not report, "import cycles (move what both sides need below both):\n" + report


# -- the scanner finds planted violations --------------------------------------------------------

PLANTED_IMPORTS: dict[str, tuple[str, str]] = {
    "optuna only in the search module": (
        "analyzer/sweep/loop.py",
        "def f():\n    from optuna.trial import TrialState\n",
    ),
    "locust and gevent only under analyzer/load": ("analyzer/report/build.py", "import gevent\n"),
    "onnxruntime only in its backend": (
        "reference_server/zoo/resnet50.py",
        "import importlib\nort = importlib.import_module('onnxruntime')\n",
    ),
    "onnx only in the zoo builders": ("reference_server/backends/simulated.py", "import onnx\n"),
    "reference_server never imports analyzer": (
        "reference_server/core/model.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from analyzer import trial\n",
    ),
    "core and batching import no frontend": (
        "reference_server/batching/scheduler.py",
        "from ..frontends import http\n",
    ),
    # Each layer importing the one right above it, in every form an import takes.
    "layer errors, documents imports nothing above it": (
        "analyzer/documents.py",
        "def read():\n    from analyzer.measure import measurement\n",
    ),
    "layer measure imports nothing above it": (
        "analyzer/measure/stepping.py",
        "from ..config.scenario import Scenario\n",
    ),
    "layer config imports nothing above it": (
        "analyzer/config/knobs.py",
        "from analyzer.rundir.records import TrialRecord\n",
    ),
    "layer rundir imports nothing above it": (
        "analyzer/rundir/records.py",
        "import analyzer.target.managed\n",
    ),
    "layer target imports nothing above it": (
        "analyzer/target/liveness.py",
        "from .. import load\n",
    ),
    "layer load imports nothing above it": (
        "analyzer/load/engine.py",
        "from analyzer.evaluation import LoadPlan\n",
    ),
    "layer evaluation imports nothing above it": (
        "analyzer/evaluation/plan.py",
        "import importlib\nstudy = importlib.import_module('analyzer.search.study')\n",
    ),
    "layer predict, search imports nothing above it": (
        "analyzer/search/strategy.py",
        "def guide():\n    from analyzer.gate.verdict import evaluate\n",
    ),
    "layer report, gate imports nothing above it": (
        "analyzer/report/build.py",
        "from analyzer.sweep.loop import run_sweep\n",
    ),
    "layer sweep imports nothing above it": (
        "analyzer/sweep/loop.py",
        "from analyzer.commands import run\n",
    ),
}


def _plant(root: Path, path: str, source: str) -> None:
    for package in PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    for parent in target.relative_to(root).parents:
        if parent != Path("."):
            (root / parent / "__init__.py").touch()
    target.write_text(source, encoding="utf-8")


def test_every_import_rule_has_a_planted_violation() -> None:
    assert set(PLANTED_IMPORTS) == set(IMPORT_RULES)


@pytest.mark.parametrize("rule", list(PLANTED_IMPORTS), ids=list(PLANTED_IMPORTS))
def test_scanner_finds_a_planted_import(tmp_path: Path, rule: str) -> None:
    path, source = PLANTED_IMPORTS[rule]
    _plant(tmp_path, path, source)
    found = IMPORT_RULES[rule].violations(scan(tmp_path))
    assert {f.path for f in found} == {path}, found
    # Every other rule stays quiet on the same tree: the rules do not overlap by accident.
    others = [r for r in IMPORT_RULES if r != rule and IMPORT_RULES[r].violations(scan(tmp_path))]
    assert others == []


@pytest.mark.parametrize(
    ("kind", "source", "line"),
    [
        ("print", "def run():\n    print('hi')\n", 2),
        ("exit", "import sys\ndef run():\n    sys.exit(2)\n", 3),
        ("exit", "def run():\n    raise SystemExit(1)\n", 2),
        ("exit", "import os\nos._exit(0)\n", 2),
        ("print", "def main():\n    pass\nif __name__ == '__main__':\n    main()\nprint(1)\n", 5),
        ("exit", "def main():\n    exit(1)\nif __name__ == '__main__':\n    helper()\n", 2),
    ],
)
def test_scanner_finds_a_planted_call(tmp_path: Path, kind: str, source: str, line: int) -> None:
    _plant(tmp_path, "analyzer/sweep/loop.py", source)
    _plant(tmp_path, "analyzer/commands/run.py", source)  # the CLI edge: allowed there
    _plant(tmp_path, "reference_server/app.py", "def serve():\n    print('x')\n")
    # The __main__ guard of a module and the function it calls are a command line of their own.
    _plant(
        tmp_path,
        "reference_server/zoo/tool.py",
        "import sys\ndef main():\n    print(1)\n    sys.exit(2)\n"
        "if __name__ == '__main__':\n    print(main())\n    sys.exit(main())\n",
    )
    found = call_violations(scan(tmp_path), kind)
    expected = [("analyzer/sweep/loop.py", line)]
    if kind == "print":  # app.py prints outside run_server: below the CLI
        expected.append(("reference_server/app.py", 2))
    assert sorted((f.path, f.line) for f in found) == sorted(expected)


def test_every_analyzer_module_lies_in_one_layer(scanners: list[_Scanner]) -> None:
    """A new module or package is placed in :data:`LAYERS` (and so under its rule)."""
    paths = [s.relative.as_posix() for s in scanners if _under(s.relative.as_posix(), "analyzer")]
    placed = {path: [name for name, held in LAYERS if _under(path, *held)] for path in paths}
    wrong = [f"{path}: {names or 'no layer'}" for path, names in placed.items() if len(names) != 1]
    assert not wrong, "modules outside LAYERS or in two layers:\n" + "\n".join(wrong)


def test_each_package_docstring_names_its_layer() -> None:
    """``analyzer/<package>/__init__.py`` says ``Layer N`` (N counted from 1, lowest first)."""
    wrong = []
    for n, (name, held) in enumerate(LAYERS, 1):
        for path in held:
            init = REPO_ROOT / path / "__init__.py"
            if not init.is_file():
                continue  # a module of the layer, not a package
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
            if f"Layer {n}" not in doc or any(f"Layer {m}" in doc for m in range(n + 1, 20)):
                wrong.append(f"{path}/__init__.py: should name Layer {n} ({name})")
    assert not wrong, "\n".join(wrong)


def test_a_type_checking_import_does_not_cross_a_layer(tmp_path: Path) -> None:
    """Annotations may name a higher layer's types; running code may not import them."""
    rule = IMPORT_RULES["layer config imports nothing above it"]
    typing_only = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from analyzer.rundir import records\n"
    )
    _plant(tmp_path, "analyzer/config/objective.py", typing_only)
    assert rule.violations(scan(tmp_path)) == []
    _plant(
        tmp_path,
        "analyzer/config/objective.py",
        typing_only + "def best():\n    from analyzer.rundir import records\n",
    )
    found = rule.violations(scan(tmp_path))
    assert [(f.line, f.function) for f in found if f.what == "analyzer.rundir.records"] == [
        (5, "best")
    ]


def test_relative_imports_resolve_against_the_package() -> None:
    core = Path("reference_server/core/model.py")
    assert _resolve(core, 1, "stats") == "reference_server.core.stats"
    assert _resolve(core, 2, "frontends.http") == "reference_server.frontends.http"
    assert _resolve(Path("reference_server/core/__init__.py"), 1, None) == "reference_server.core"
    assert _resolve(Path("reference_server/core/__init__.py"), 2, "app") == "reference_server.app"


#: A planted tree: three cycles (a module-level import against a lazy relative one; a package
#: ``__init__`` whose lazy ``__getattr__`` imports a module that takes a name from the package;
#: ``importlib.import_module``) and imports that are no cycle (``TYPE_CHECKING``; a submodule
#: imported by a sibling of its package).
PLANTED_GRAPH: dict[str, str] = {
    "analyzer/a.py": "from analyzer.b import helper\n",
    "analyzer/b.py": "def helper():\n    from . import a\n",
    "analyzer/c.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from analyzer.d import D\n"
    ),
    "analyzer/d.py": "from analyzer.c import C\n",
    "analyzer/pkg/__init__.py": (
        "VERSION = 1\ndef __getattr__(name):\n    from analyzer.pkg import mod\n    return mod\n"
    ),
    "analyzer/pkg/mod.py": "from analyzer.pkg import VERSION\n",
    "analyzer/pkg/low.py": "X = 1\n",
    "analyzer/e.py": "import analyzer.pkg.low\nfrom analyzer.pkg.low import X\n",
    "reference_server/x.py": "import importlib\nY = importlib.import_module('reference_server.y')\n",
    "reference_server/y.py": "from .x import Y\n",
}


def test_a_planted_import_cycle_is_found_and_reported(tmp_path: Path) -> None:
    for path, source in PLANTED_GRAPH.items():
        _plant(tmp_path, path, source)
    graph = import_graph(tmp_path)
    assert graph["analyzer.e"].keys() == {"analyzer.pkg.low"}  # not its package: not a cycle
    assert graph["analyzer.c"] == {}  # TYPE_CHECKING only
    assert import_cycles(graph) == [
        ["analyzer.a", "analyzer.b", "analyzer.a"],
        ["analyzer.pkg", "analyzer.pkg.mod", "analyzer.pkg"],
        ["reference_server.x", "reference_server.y", "reference_server.x"],
    ]
    report = cycle_report(graph)
    assert "analyzer.a -> analyzer.b -> analyzer.a" in report
    assert "analyzer.b -> analyzer.a: analyzer/b.py:2 in helper(): analyzer.a" in report
    assert "analyzer.pkg.mod -> analyzer.pkg: analyzer/pkg/mod.py:1: analyzer.pkg.VERSION" in report
    # Without the lazy import, the first cycle is gone and the others stay.
    _plant(tmp_path, "analyzer/b.py", "def helper():\n    pass\n")
    assert [c[0] for c in import_cycles(import_graph(tmp_path))] == [
        "analyzer.pkg",
        "reference_server.x",
    ]


# -- a private name stays in its package ---------------------------------------------------------


def private_crossings(scanners: list[_Scanner]) -> list[Finding]:
    """Imports of a private name (``_x``, not a dunder) or a private module from another package.

    A leading underscore means "this package's business": modules of one package and of the
    packages inside it may share such names (``load/runner.py`` uses ``load/windows.py``'s
    ``_Window``; ``load/web/`` uses ``load/_gevent.py``); any other package goes through what
    the package's modules export without one.
    """
    packages = {
        s.relative.parent.as_posix().replace("/", ".")
        for s in scanners
        if s.relative.name == "__init__.py"
    }
    found = []
    for scanner in scanners:
        importer = scanner.relative.parent.as_posix().replace("/", ".")
        for finding in scanner.imports:
            parts = finding.what.split(".")
            first = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")),
                None,
            )
            # ``from X import a`` is found as ``X`` and as ``X.a``: the second one says it all.
            if parts[0] not in PACKAGES or first is None or finding.from_base:
                continue
            # The private part lies in the package above it: "pkg._mod" or "pkg.mod._name".
            owner = ".".join(parts[:first])
            if owner not in packages:
                owner = ".".join(parts[: first - 1])
            if not _imports(owner, importer):
                found.append(finding)
    return found


def test_no_private_name_crosses_a_package(scanners: list[_Scanner]) -> None:
    found = private_crossings(scanners)
    assert not found, "private names used outside their package:\n" + "\n".join(map(str, found))


def test_a_planted_private_crossing_is_found(tmp_path: Path) -> None:
    _plant(tmp_path, "analyzer/sweep/state.py", "class _State:\n    pass\n")
    _plant(tmp_path, "analyzer/sweep/loop.py", "from analyzer.sweep.state import _State\n")
    _plant(tmp_path, "analyzer/sweep/trials.py", "from .state import _State\n")
    _plant(tmp_path, "analyzer/report/build.py", "from analyzer.sweep.state import _State\n")
    _plant(tmp_path, "analyzer/gate/run.py", "def f():\n    from ..sweep import _private\n")
    _plant(tmp_path, "analyzer/commands/run.py", "from analyzer.sweep.state import __doc__\n")
    _plant(tmp_path, "analyzer/load/_gevent.py", "X = 1\n")
    _plant(tmp_path, "analyzer/load/web/users.py", "from analyzer.load import _gevent\n")
    _plant(tmp_path, "analyzer/report/svg.py", "from analyzer.load._gevent import X\n")
    found = private_crossings(scan(tmp_path))
    assert sorted((f.path, f.line) for f in found) == [
        ("analyzer/gate/run.py", 2),
        ("analyzer/report/build.py", 1),
        ("analyzer/report/svg.py", 1),
    ]
