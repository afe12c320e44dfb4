"""``import einsummable`` stays fast: what only some paths need (ml_dtypes for bf16) is
imported on first use."""

import os
import subprocess
import sys
from pathlib import Path

import einsummable

SRC = str(Path(einsummable.__file__).resolve().parents[1])


def _python(code: str, *flags: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60, check=True)


def test_import_leaves_the_heavy_optional_modules_unimported():
    heavy = {"ml_dtypes", "torch", "matplotlib", "ray"}
    code = f"import sys, einsummable; print(sorted({heavy!r} & set(sys.modules)))"
    assert _python(code).stdout.strip() == "[]"


def test_import_takes_under_half_a_second(tmp_path, monkeypatch):
    """Python's own -X importtime figure for the package (best of three, on a loaded machine),
    its bytecode cached as an install caches it: a box that sets PYTHONDONTWRITEBYTECODE (as
    CI's do) would otherwise time the compiling of every source of a fresh clone (0.6 s)."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path))
    _python("import einsummable")  # compile once into tmp_path
    best = min(int(_python("import einsummable", "-X", "importtime").stderr.strip().splitlines()[-1]
                   .split("|")[1]) for _ in range(3))
    assert best < 500_000, f"import einsummable took {best / 1e6:.2f} s"
