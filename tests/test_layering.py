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
    ("einsummable.hardware.cluster", "einsummable.engines.ray.nodes"):
        "Cluster.from_ray reuses the Ray engine's node discovery; Ray stays an optional extra",
    ("einsummable.hardware.calibrate", "einsummable.engines.cbuild"):
        "Cluster.measure times a join's nodes as the compiled kernels run them (calibrate.node_cost)",
    ("einsummable.hardware.calibrate", "einsummable.engines.kernels"):
        "Cluster.measure times a join's nodes as the compiled kernels run them (calibrate.node_cost)",
    ("einsummable.hardware.calibrate", "einsummable.engines.native"):
        "Cluster.measure times a join's nodes as the compiled kernels run them (calibrate.node_cost)",
    ("einsummable.hardware.calibrate", "einsummable.engines.ray.nodes"):
        "calibrate.ray_link measures machines 0 and 1 as the Ray engine orders its nodes",
    ("einsummable.hardware.calibrate", "einsummable.engines.local"):
        "Cluster.measure times the local engine's own cost per task (calibrate.dispatch)",
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
