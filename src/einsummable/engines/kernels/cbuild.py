"""Build generated C kernels with the system compiler, cache them on disk, load them with ctypes.

- Cached per kernel: each function is named on disk by a hash of its source, the
  flags, the compiler's version and the CPU (``-march=native`` code is only valid on
  the CPU that built it), under ``$XDG_CACHE_HOME/einsummable/kernels`` (or
  ``~/.cache``): ``f<hash>.so`` links to the library that holds it. Kernels missing
  from the cache are compiled together, one library per batch; so a process whose
  batch differs from another's (a Ray worker, a subprocess, the next program) still
  finds each kernel another built, rather than rebuilding it in a new batch.
  Libraries and links are written to temporary names and ``os.replace``-d into place,
  so processes that build at once never read a half-written file.
- ``build(sources)`` builds many kernels at once, in a few translation units
  compiled in parallel; ``function(src)`` builds one on demand otherwise.
- No compiler, or a failed build: one warning, and every kernel stays on numpy.
  ``EINSUMMABLE_KERNELS=numpy`` asks for that without trying.
- ctypes releases the GIL around each call, so worker threads run kernels in parallel.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from einsummable.engines.kernels import ccodegen, cprelude
from einsummable.engines.kernels.ccodegen import Source
from einsummable.ir.einsummable import Einsummable

__all__ = ["Source", "build", "function", "source"]

# -O2: as fast as -O3 on every benchmarks/join_kernels.py pattern (the loops are `omp simd`,
# vectorized either way), at half the compile time, which a fresh cache pays per kernel.
FLAGS = ("-O2", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
         "-fopenmp-simd", "-fPIC", "-shared")
LIBS = ("-lmvec", "-lm")
BATCH = 24  # kernels per translation unit; units compile in parallel
ENV = "EINSUMMABLE_KERNELS"

_lock = threading.RLock()
_functions: dict[str, ctypes._CFuncPtr] = {}
_failed: list[str] = []  # the reason compiled kernels are off, once known


def enabled() -> bool:
    """Whether compiled kernels are in use: asked for, and the compiler has not failed."""
    return os.environ.get(ENV, "c").lower() not in ("numpy", "off", "0") and not _failed


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "einsummable" / "kernels"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def source(op: Einsummable) -> Source | None:
    return ccodegen.generate(op) if enabled() else None


def function(src: Source) -> ctypes._CFuncPtr | None:
    """The loaded function for ``src``; builds it alone if no batch did."""
    fn = _functions.get(src.name)
    if fn is None and enabled():
        build([src])
        fn = _functions.get(src.name)
    return fn


def build(sources: list[Source]) -> None:
    """Load every source not loaded yet: from the cache, else compiled in batches."""
    with _lock:
        todo = {s.name: s for s in sources if s.name not in _functions}
        if not todo or _failed:
            return
        cc = compiler()
        if cc is None:
            _fail("no C compiler found (set CC, or install gcc)")
            return
        where = cache_dir()
        try:
            links = {name: where / f"f{_key(cc, cprelude.PRELUDE + src.text)}.so"
                     for name, src in todo.items()}
            missing = [todo[n] for n in sorted(todo) if not links[n].exists()]
            batches = [missing[i : i + BATCH] for i in range(0, len(missing), BATCH)]
            if batches:
                with ThreadPoolExecutor(max(1, min(len(batches), os.cpu_count() or 1))) as pool:
                    for path, batch in zip(pool.map(lambda b: _library(cc, b), batches), batches,
                                           strict=True):
                        for src in batch:
                            _link(links[src.name], path)
        except (OSError, subprocess.SubprocessError) as err:
            _fail(str(err))
            return
        libraries: dict[str, ctypes.CDLL] = {}
        for name, link in links.items():
            path = os.path.realpath(link)
            if path not in libraries:
                libraries[path] = ctypes.CDLL(path)
            fn = getattr(libraries[path], name)
            fn.restype = None
            _functions[name] = fn


def _key(cc: str, text: str) -> str:
    """The cache name of C ``text`` built by ``cc`` with our flags on this CPU."""
    return hashlib.sha256("\0".join([text, *FLAGS, *LIBS, _identity(cc)]).encode()).hexdigest()[:32]


def _library(cc: str, batch: list[Source]) -> Path:
    """Compile ``batch`` into one library in the cache; returns its path."""
    text = cprelude.PRELUDE + "\n".join(s.text for s in batch)
    where = cache_dir()
    path = where / f"k{_key(cc, text)}.so"
    if path.exists():
        return path
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix=".build-") as tmp:
        c_file, so_file = Path(tmp) / "kernels.c", Path(tmp) / "kernels.so"
        c_file.write_text(text)
        done = subprocess.run([cc, *FLAGS, str(c_file), "-o", str(so_file), *LIBS],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise subprocess.SubprocessError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
        os.replace(so_file, path)
    return path


def _link(link: Path, library: Path) -> None:
    """Point ``link`` at ``library`` (a sibling), atomically."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.unlink(missing_ok=True)
    os.symlink(library.name, tmp)
    os.replace(tmp, link)


_identities: dict[str, str] = {}


def _identity(cc: str) -> str:
    """The compiler's version and the CPU's flags: what ``-march=native`` code depends on."""
    if cc not in _identities:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((line for line in f if line.startswith(("flags", "Features"))), "")
        except OSError:
            pass
        _identities[cc] = f"{version}|{platform.machine()}|{cpu}"
    return _identities[cc]


def _fail(reason: str) -> None:
    if not _failed:
        _failed.append(reason)
        warnings.warn(f"einsummable: compiled kernels are unavailable ({reason}); "
                      f"using numpy kernels instead", RuntimeWarning, stacklevel=3)
