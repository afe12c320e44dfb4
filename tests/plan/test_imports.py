"""The import rule: plan imports only ir; lower imports ir and plan; engines never import
frontend, plan internals aside; only compile.py (and the CLI) import engines."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "einsummable"
ALLOWED = {
    "plan": {"ir", "hardware", "plan", "errors"},
    "lower": {"ir", "hardware", "plan", "lower", "errors"},
}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("einsummable"):
            parts = node.module.split(".")
            out.add(parts[1] if len(parts) > 1 else "")
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("einsummable.")}
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_upstream(package):
    for path in (SRC / package).glob("*.py"):
        bad = _imports(path) - ALLOWED[package]
        assert not bad, f"{path.name} imports einsummable.{bad}"


def test_sequential_engine_imports_lower_and_ir_only():
    assert _imports(SRC / "engines" / "sequential.py") <= {"engines", "ir", "lower"}
