"""Building compiled kernels: the disk cache, the numpy fallback and its one warning.

Each case runs in a fresh process, with its own cache directory and compiler, since
the build state (loaded libraries, a failed compiler) is per process by design.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from einsummable.engines.kernels import cbuild, native
from einsummable.ir.einsummable import Einsummable

SCRIPT = textwrap.dedent("""
    import os, warnings, numpy as np
    from einsummable.engines.kernels import fast as kernels, reference as reference_kernel
    from einsummable.ir.einsummable import Einsummable
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
        ops = [Einsummable.from_spec("ij->ij", [(4, 6)], join=j)
               for j in os.environ.get("JOINS", "silu(x0);x0 * 2;exp(x0)").split(";")]
        prepared = [kernels.prepare(op) for op in ops]  # prepared together: built together
        for op, kernel in zip(ops, prepared):
            got = kernel([x], None)
            np.testing.assert_allclose(got, reference_kernel.einsum(op, [x]), rtol=1e-6)
    from einsummable.engines.kernels import cbuild
    print("compiled:", len(cbuild._functions))
    print("warnings:", sum("compiled kernels are unavailable" in str(w.message) for w in caught))
""")


def _run(tmp_path: Path, cc: str, **env: str) -> str:
    src = str(Path(__file__).resolve().parents[2] / "src")
    full = {**os.environ, "CC": cc, "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def logging_cc(tmp_path: Path) -> tuple[str, Path]:
    """A compiler that logs its calls, then runs the real one."""
    real = cbuild.compiler()
    if real is None:
        pytest.skip("no C compiler")
    log = tmp_path / "cc.log"
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    cc.chmod(0o755)
    return str(cc), log


def test_a_failing_compiler_falls_back_to_numpy_with_one_warning(tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho broken >&2\nexit 1\n")
    cc.chmod(0o755)
    out = _run(tmp_path, str(cc))
    assert "warnings: 1" in out and "compiled: 0" in out


def test_a_missing_compiler_falls_back_to_numpy_with_one_warning(tmp_path):
    out = _run(tmp_path, str(tmp_path / "no-such-cc"))
    assert "warnings: 1" in out and "compiled: 0" in out


def test_kernels_build_once_then_come_from_the_disk_cache(tmp_path, logging_cc):
    cc, log = logging_cc
    first = _run(tmp_path, cc)
    assert "warnings: 0" in first and "compiled: 3" in first
    builds = [line for line in log.read_text().splitlines() if "--version" not in line]
    assert len(builds) == 1, "the three kernels prepared together build as one batch"
    where = tmp_path / "cache" / "einsummable" / "kernels"
    libraries = list(where.glob("k*.so"))
    assert len(libraries) == 1
    links = list(where.glob("f*.so"))
    assert len(links) == 3 and {p.resolve() for p in links} == {libraries[0].resolve()}
    second = _run(tmp_path, cc)
    assert "warnings: 0" in second and "compiled: 3" in second
    again = [line for line in log.read_text().splitlines() if "--version" not in line]
    assert again == builds, "a cached run compiles nothing"
    assert not [p for p in where.iterdir() if p.name.startswith(".")]


def test_a_kernel_built_in_one_batch_is_found_by_a_process_that_asks_in_another(tmp_path, logging_cc):
    """A Ray worker or a later program asks for another set of kernels: only the new ones build."""
    cc, log = logging_cc
    _run(tmp_path, cc)
    out = _run(tmp_path, cc, JOINS="exp(x0);x0 * 3;silu(x0)")
    assert "warnings: 0" in out and "compiled: 3" in out
    builds = [line for line in log.read_text().splitlines() if "--version" not in line]
    assert len(builds) == 2, "the second process compiles one batch"
    where = tmp_path / "cache" / "einsummable" / "kernels"
    first, new = sorted(where.glob("k*.so"), key=lambda p: p.stat().st_mtime_ns)
    targets = Counter(p.resolve() for p in where.glob("f*.so"))
    assert targets == {first.resolve(): 3, new.resolve(): 1}, "x0 * 3 alone is new"


def test_numpy_kernels_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv(cbuild.ENV, "numpy")
    op = Einsummable.from_spec("ij->ij", [(2, 3)], join="exp(x0)")

    def fallback(arrays, variables):
        return np.exp(arrays[0])

    assert native.kernel(op, fallback) is fallback
