"""The code's shape, as issue 32 measures it: modules per folder, the largest files, import cycles
(``from pkg import sub`` counting as importing ``pkg/__init__.py`` too), imports that reach up the
layering (docs/design.md §10), and the files that preparing a local program passes through.

The last is traced, not read: ``sys.setprofile`` follows ``LocalProgram(tg)`` for the Llama demo's
training step at 2 workers, counting the package files it enters and how often it comes back to
one it had left (a pipeline goes down; a back-and-forth returns).

    python benchmarks/architecture.py [--src PATH]     # PATH: another checkout's src/, to compare
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import sys
from pathlib import Path

LAYERS = {  # tests/test_layering.py's table
    "errors": set(), "progress": set(), "ir": {"errors"}, "hardware": {"errors", "ir"},
    "frontend": {"errors", "ir"}, "autodiff": {"errors", "ir", "frontend"},
    "plan": {"errors", "ir", "hardware"}, "lower": {"errors", "ir", "plan", "hardware"},
    "engines": {"errors", "ir", "hardware", "lower", "progress"},
}


def modules(src: Path) -> dict[str, Path]:
    out = {}
    for p in sorted((src / "einsummable").rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(mods: dict[str, Path], name: str) -> set[str]:
    """The package modules ``name`` imports: ``from pkg import sub`` imports ``pkg/__init__.py``
    and ``sub``; ``import a.b`` imports ``a.b``."""
    out = set()
    for node in ast.walk(ast.parse(mods[name].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("einsummable"):
            targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("einsummable")]
        else:
            continue
        out |= {t for t in targets if t in mods and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def area(m: str) -> str:
    parts = m.split(".")
    return parts[1] if len(parts) > 1 else "einsummable"


def prepare_trace(src: Path) -> tuple[int, int, int]:
    """While ``LocalProgram(tg)`` runs: the package files entered, the distinct calls from one
    file into another, and how many of those go back to a file entered before the caller."""
    sys.path.insert(0, str(src))
    es = importlib.import_module("einsummable")
    local = importlib.import_module("einsummable.engines.local")
    training_graph = importlib.import_module("einsummable.cli_plan").training_graph
    presets = importlib.import_module("einsummable.models.llama").PRESETS
    tg = es.compile(training_graph(presets["demo"], 16, 64), workers=2, engine="simulate").taskgraph
    root = str(src / "einsummable")
    order: dict[str, int] = {}
    edges: set[tuple[str, str]] = set()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(root):
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename if frame.f_back else ""
        order.setdefault(callee, len(order))
        if caller.startswith(root) and caller != callee:
            edges.add((caller, callee))

    sys.setprofile(profile)
    try:
        local.LocalProgram(tg)
    finally:
        sys.setprofile(None)
    back = sum(order[b] < order[a] for a, b in edges)
    return len(order), len(edges), back


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    src = Path(ap.parse_args().src).resolve()
    mods = modules(src)
    per_folder = collections.Counter(str(p.parent.relative_to(src)) for p in mods.values())
    print("modules per folder (.py files):")
    for folder, n in sorted(per_folder.items()):
        print(f"  {folder:<36} {n:3d}{'  (over 15)' if n > 15 else ''}")
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(src))) for p in mods.values()),
                   reverse=True)
    print("largest files:", ", ".join(f"{f} {n}" for n, f in sizes[:5]),
          f"({sum(n > 450 for n, _ in sizes)} over 450 lines)")
    graph = {m: imports(mods, m) for m in mods}
    found = cycles(graph)
    print(f"import cycles: {len(found)}", *(" <-> ".join(c) for c in found), sep="\n  " if found else " ")
    upward = sorted((m, t) for m, ts in graph.items() for t in ts if area(m) in LAYERS
                    and area(t) != area(m) and area(t) not in LAYERS[area(m)])
    print(f"upward imports: {len(upward)}", *(f"{m} -> {t}" for m, t in upward),
          sep="\n  " if upward else " ")
    files, edges, back = prepare_trace(src)
    print(f"preparing a local program (Llama demo step, 2 workers): {files} files entered, {edges} "
          f"calls between files, {back} of them back to a file entered earlier")


if __name__ == "__main__":
    main()
