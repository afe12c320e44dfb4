"""The package's layering, checked on every module under src/einsummable (docs/design.md §10).

Each area may import only from the areas below it (and from itself):

    errors, progress            nothing of the package
    ir                          errors
    hardware                    ir
    frontend                    ir
    autodiff                    ir, frontend (its rules are written with the frontend's tensor ops)
    plan                        ir, hardware
    lower                       ir, plan, hardware
    engines                     ir, hardware, lower, progress
    models, train, compile,     anything: they are the top, with the package itself
    cli, cli_args, cli_plan, workloads (``import einsummable as es``)

Imports inside functions count too; the few deliberate lazy edges are listed with why.
"""

import ast
import itertools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "einsummable"
BASE = {"errors"}
ALLOWED = {
    "errors": set(),
    "progress": set(),
    "ir": BASE,
    "hardware": BASE | {"ir"},
    "frontend": BASE | {"ir"},
    "autodiff": BASE | {"ir", "frontend"},
    "plan": BASE | {"ir", "hardware"},
    "lower": BASE | {"ir", "plan", "hardware"},
    "engines": BASE | {"ir", "hardware", "lower", "progress"},
}
TOP = {"einsummable", "__main__", "compile", "cli", "cli_args", "cli_plan", "models", "train", "workloads"}
# (importer, imported): why the lower module may reach up, inside a function only
LAZY = {
    ("einsummable.hardware.cluster", "einsummable.engines.ray_nodes"):
        "Cluster.from_ray reuses the Ray engine's node discovery; Ray stays an optional extra",
    ("einsummable.hardware.calibrate", "einsummable.engines.kernels.cbuild"):
        "Cluster.measure times a join's nodes as the compiled kernels run them (calibrate.node_cost)",
    ("einsummable.hardware.calibrate", "einsummable.engines.kernels.fast"):
        "Cluster.measure times a join's nodes as the compiled kernels run them (calibrate.node_cost)",
    ("einsummable.hardware.calibrate", "einsummable.engines.kernels.native"):
        "Cluster.measure times a join's nodes as the compiled kernels run them (calibrate.node_cost)",
    ("einsummable.hardware.calibrate", "einsummable.engines.ray_nodes"):
        "calibrate.ray_link measures machines 0 and 1 as the Ray engine orders its nodes",
    ("einsummable.hardware.calibrate", "einsummable.engines.gpu"):
        "Cluster.gpus(measure=True) times the GPU engine's own cost per task (calibrate.gpu_dispatch)",
    ("einsummable.hardware.calibrate", "einsummable.engines.local"):
        "Cluster.measure times the local engine's own cost per task (calibrate.dispatch)",
    ("einsummable.hardware.calibrate", "einsummable.engines.storage"):
        "Cluster.measure times host storage where the engines store offloaded blocks",
    ("einsummable.hardware.calibrate", "einsummable.lower.taskgraph"):
        "... on a TaskGraph of tiny tasks it builds for that",
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "einsummable"


def _resolve(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """``from .x import y`` in ``module``, as the absolute module name it reads."""
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports(module: str, source: str | None = None) -> dict[str, bool]:
    """The package modules ``module`` imports (``source``: its text, read from disk when not
    given) -> whether only inside functions. Relative imports count as well as absolute."""
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
    top = {id(n) for n in ast.iter_child_nodes(tree)}
    for node in ast.walk(tree):  # imports under a module-level if/try still run at import time
        if isinstance(node, ast.If | ast.Try) and id(node) in top:
            top |= {id(n) for n in ast.walk(node)}
    out: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _absolute(module, node).split(".")[0] == "einsummable":
            base = _absolute(module, node)
            names = [f"{base}.{a.name}" for a in node.names]
            names = [n if n in MODULES else base for n in names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "einsummable"]
        else:
            continue
        for n in names:
            target = _resolve(n)
            if target != module:
                out[target] = out.get(target, True) and id(node) not in top
    return out


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if _area(m) not in ALLOWED and _area(m) not in TOP)
    assert not unplaced, f"place these in the layering (tests/test_layering.py, docs/design.md): {unplaced}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _area(m) in ALLOWED))
def test_imports_go_only_down(module):
    area = _area(module)
    bad = []
    for target, lazy in imports(module).items():
        to = _area(target)
        if to == area or to in ALLOWED[area]:
            continue
        if lazy and (module, target) in LAZY:
            continue
        bad.append(f"{target}{' (inside a function)' if lazy else ''}")
    assert not bad, f"{module} ({area}) may import only {sorted(ALLOWED[area])}, but imports {bad}"


def test_no_import_cycles_between_files():
    graph = {m: set(imports(m)) for m in MODULES}
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def package_edges(module: str, source: str | None = None) -> dict[str, int]:
    """What running ``module`` (``source``: its text, read from disk when not given) makes
    Python import -> the line of the first import that does: the module named and every
    package on the way to it, so ``from einsummable.models.llama import lora`` imports
    einsummable.models, einsummable.models.llama and einsummable.models.llama.lora, and
    ``from pkg import name`` imports pkg's ``__init__`` whatever name is. Imports inside
    functions count (they run at call time); those under ``if TYPE_CHECKING:`` do not.

    The packages that hold ``module`` itself are left out where they are only on the way
    (``from einsummable.errors import X`` does not import ``einsummable``): Python starts
    them before ``module`` and only looks them up there. Named outright (``import
    einsummable``, ``from einsummable import X``, ``from . import x``), they count."""
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    held = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    if MODULES[module].name == "__init__.py":
        held.add(module)
    out: dict[str, int] = {}

    def add(target: str, named: bool, line: int) -> None:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in MODULES and name != module and (name not in held or (named and i == len(parts))):
                out.setdefault(name, line)

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "einsummable":
                    add(a.name, True, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            if base.split(".")[0] != "einsummable":
                continue
            add(base, True, node.lineno)
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    add(f"{base}.{a.name}", True, node.lineno)
    return out


def _cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle through ``component`` (strongly connected), shortest from its first name."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        step = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    chain = [v]
                    while chain[-1] != start:
                        chain.append(previous[chain[-1]])
                    return [*reversed(chain), start]
                if w not in previous:
                    previous[w] = v
                    step.append(w)
        frontier = step
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_no_import_cycles_through_packages():
    """Issue 32: no cycle, counting ``from pkg import sub`` as importing pkg/__init__.py. A
    package's ``__init__`` imports its submodules (and einsummable's re-exports the public
    API), so a module that imports its own package (``import einsummable``, ``from
    einsummable.models.llama import weights``) closes a loop: import from the defining
    module instead (``from einsummable.models.llama.weights import ...``)."""
    edges = {m: package_edges(m) for m in MODULES}
    graph = {m: set(e) for m, e in edges.items()}
    chains = []
    for component in _strongly_connected(graph):
        if len(component) > 1:
            chain = _cycle(graph, component)
            where = [f"    {a} -> {b}: {MODULES[a].relative_to(SRC.parent)}:{edges[a][b]}"
                     for a, b in itertools.pairwise(chain)]
            chains.append(" -> ".join(chain) + "\n" + "\n".join(where))
    assert not chains, "import cycles (one per tangle):\n" + "\n".join(chains)


def test_the_package_scan_counts_every_package_on_the_way():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from einsummable.errors import ConfigError\n"
        "from einsummable.models.llama import safetensors_io\n"
        "from . import config\n"
        "from .model import forward\n"
        "import einsummable.plan.plan\n"
        "def f():\n"
        "    from einsummable import Graph\n"
        "if TYPE_CHECKING:\n"
        "    from einsummable.train.trainer import Trainer\n"
    )
    assert set(package_edges("einsummable.models.llama.lora", source)) == {
        "einsummable.errors",
        "einsummable.models.llama",
        "einsummable.models.llama.safetensors_io",
        "einsummable.models.llama.config",
        "einsummable.models.llama.model",
        "einsummable.plan",
        "einsummable.plan.plan",
        "einsummable",
    }
    init = "from einsummable.models.llama.api import Model\n"  # a package's __init__ imports its own
    assert set(package_edges("einsummable.models.llama", init)) == {"einsummable.models.llama.api"}
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}}
    assert _cycle(graph, {"a", "b", "c"}) == ["a", "b", "a"]


def test_the_import_scan_sees_every_spelling():
    """The checks above are only as good as this scan: imports inside functions, relative
    imports and submodules named in ``from package import module`` all count."""
    source = (
        "import numpy\n"
        "from . import einsum\n"
        "from .shapes import broadcast_shapes\n"
        "from ..ir import box\n"
        "import einsummable as es\n"
        "def f():\n"
        "    from einsummable.engines.reference import run\n"
    )
    assert imports("einsummable.frontend.tensor", source) == {
        "einsummable.frontend.einsum": False,
        "einsummable.frontend.shapes": False,
        "einsummable.ir.box": False,
        "einsummable": False,
        "einsummable.engines.reference": True,
    }
    cycle = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [c for c in _strongly_connected(cycle) if len(c) > 1] == [{"a", "b", "c"}]


def test_every_exception_lives_in_errors():
    stray = []
    for module, path in MODULES.items():
        if module == "einsummable.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    stray.append(f"{module}.{node.name}")
    assert not stray, f"user-facing exceptions belong in einsummable/errors.py: {stray}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out
