"""A join lowered to numpy: a short sequence of ufunc calls over ``out=`` buffers.

Half precision (f16, bf16) is computed in f32 and rounded once, at the end: the
join is one fused kernel, as XLA fuses it (excess precision allowed) and as
torch's fused kernels compute. Rounding after every ufunc would cost a
bf16 ulp per step (``exp(x - m)`` loses 2% at x - m = -5), and numpy's own
ml_dtypes loops are slower than f32 anyway. An explicit ``cast(.., bf16)`` still
rounds where it stands. Callers that reduce the join (``wide=True``) take the f32
values and round after the reduction, so a sum rounds once, not once per term.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from einsummable.ir.dtypes import to_numpy
from einsummable.ir.expr import Cast, Const, Expr, Input, Var, children
from einsummable.ir.scalar import _variable, dtype_of, parse, result_dtype
from einsummable.ir.scalar_ops import OPS, is_call

HALF = ("f16", "bf16")
WIDE = np.dtype(np.float32)  # where half precision is computed and accumulated


def working(dtype: str) -> np.dtype:
    """The numpy dtype values of ``dtype`` are computed in: f32 for the half types."""
    return WIDE if dtype in HALF else to_numpy(dtype)


class Compiled:
    """A join lowered to a short sequence of numpy ufunc calls over ``out=`` buffers.

    Temporaries are reused once dead, and single-ufunc steps run in place.
    """

    def __init__(self, e: Expr, input_dtypes: Sequence[str]) -> None:
        self.expr = parse(e)
        self.input_dtypes = tuple(input_dtypes)
        self.dtype = result_dtype(self.expr, self.input_dtypes)
        # the inputs computed in f32 (None: as they come)
        self._widen = tuple(WIDE if d in HALF else None for d in self.input_dtypes)
        self._steps: list[tuple] = []
        self._plans: dict[tuple, list[tuple[int, ...]]] = {}
        memo: dict[Expr, tuple] = {}
        root = self.expr
        # a final cast to the result's half type is the rounding the result gets anyway
        self._rounds = isinstance(root, Cast) and root.dtype in HALF and root.dtype == self.dtype
        self._root = self._lower(root.arg if self._rounds else root, memo)
        last_use: dict[int, int] = {}
        for k, (_, args, _, _) in enumerate(self._steps):
            for ref in args:
                if ref[0] == "reg":
                    last_use[ref[1]] = k
        # dict.fromkeys: a step may read one register twice, as in add(t, t); it dies once.
        self._dies = [
            list(dict.fromkeys(ref[1] for ref in args if ref[0] == "reg" and last_use[ref[1]] == k))
            for k, (_, args, _, _) in enumerate(self._steps)
        ]

    def _shapes(self, inputs: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
        """Each step's broadcast shape, once per input shapes: ``np.broadcast_shapes`` is
        slow enough to matter over the thousands of blocks a step runs."""
        shapes = self._plans.get(inputs)
        if shapes is None:
            shapes = []
            for _, args, _, _ in self._steps:
                shapes.append(np.broadcast_shapes(
                    *(inputs[v] if kind == "in" else shapes[v] for kind, v in args if kind in ("in", "reg"))))
            self._plans[inputs] = shapes
        return shapes

    def _lower(self, e: Expr, memo: dict[Expr, tuple]) -> tuple:
        if e in memo:
            return memo[e]
        if isinstance(e, Input):
            ref = ("in", e.index)
        elif isinstance(e, Const):
            ref = ("const", e.value)
        elif isinstance(e, Var):
            ref = ("var", e.name)
        elif is_call(e, "stop_gradient"):
            ref = self._lower(e.args[0], memo)  # a value identity: no pass over the data
        elif isinstance(e, Cast) and e.dtype not in HALF and working(self._dtype(e.arg)) == to_numpy(e.dtype):
            ref = self._lower(e.arg, memo)  # a half value widened: it is f32 here already
        else:
            args = tuple(self._lower(k, memo) for k in children(e))
            dtype = self._dtype(e)
            if isinstance(e, Cast):
                rounds = e.dtype in HALF
                rule_kernel, inplace = (_rounding(to_numpy(e.dtype)) if rounds else _cast_kernel), False
            else:
                rule = OPS[e.op]
                rule_kernel, inplace = rule.kernel, rule.inplace
                if e.op == "pow":
                    args = (args[0], ("scalar", e.args[1].value))
            self._steps.append((rule_kernel, args, working(dtype), inplace))
            ref = ("reg", len(self._steps) - 1)
        memo[e] = ref
        return ref

    def _dtype(self, e: Expr) -> str:
        return dtype_of(e, self.input_dtypes) or self.dtype

    def __call__(
        self,
        *arrays: np.ndarray,
        out: np.ndarray | None = None,
        variables: dict[str, float] | None = None,
        wide: bool = False,
    ) -> np.ndarray:
        """The join over broadcast-compatible ``arrays``, in ``self.dtype``; with ``wide``,
        half precision comes back unrounded in f32, for the caller to reduce first."""
        regs: dict[int, np.ndarray] = {}
        pool: dict[tuple, list[np.ndarray]] = {}

        def value(ref: tuple):
            kind, v = ref
            if kind == "in":
                return arrays[v]
            if kind == "reg":
                return regs[v]
            if kind == "var":
                return _variable(v, variables)
            return v

        if self._root[0] != "reg":
            result = value(self._root)
            if out is None:
                return np.array(result, dtype=to_numpy(self.dtype))
            np.copyto(out, result, casting="unsafe")
            return out
        if any(self._widen):
            arrays = tuple(a if w is None else np.asarray(a, dtype=w)
                           for a, w in zip(arrays, self._widen, strict=True))
        n = len(self._steps)
        shapes = self._shapes(tuple(np.shape(a) for a in arrays))
        for k, (kernel, args, dtype, inplace) in enumerate(self._steps):
            vals = [value(a) for a in args]
            shape = shapes[k]
            key = (shape, dtype)
            if inplace:
                for r in self._dies[k]:
                    pool.setdefault((regs[r].shape, regs[r].dtype), []).append(regs.pop(r))
            if k == n - 1 and out is not None and out.shape == shape and out.dtype == dtype:
                buf = out
            elif pool.get(key):
                buf = pool[key].pop()
            else:
                buf = np.empty(shape, dtype=dtype)
            kernel(buf, *vals)
            regs[k] = buf
            if not inplace:
                for r in self._dies[k]:
                    pool.setdefault((regs[r].shape, regs[r].dtype), []).append(regs.pop(r))
        result = regs[n - 1]
        if out is not None and result is not out:
            np.copyto(out, result, casting="unsafe")
            return out
        if wide and self._rounds:  # the terms of a sum round before it adds them
            return result.astype(to_numpy(self.dtype)).astype(WIDE)
        if not wide and result.dtype != to_numpy(self.dtype):
            return result.astype(to_numpy(self.dtype))
        return result


def _cast_kernel(out: np.ndarray, a: np.ndarray) -> None:
    np.copyto(out, a, casting="unsafe")


def _rounding(half: np.dtype):
    """A cast to a half type, kept in f32: the value rounds, the working dtype stays."""
    def kernel(out: np.ndarray, a: np.ndarray) -> None:
        np.copyto(out, np.asarray(a).astype(half), casting="unsafe")

    return kernel


def compile_expr(e: Expr | str, input_dtypes: Sequence[str]) -> Compiled:
    return Compiled(parse(e), input_dtypes)
