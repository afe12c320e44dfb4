"""A join lowered to numpy: a short sequence of ufunc calls over ``out=`` buffers.

Half precision (f16, bf16) is computed in f32 and rounded once, at the end: the
join is one fused kernel, as XLA fuses it (excess precision allowed) and as
torch's fused kernels compute. Rounding after every ufunc would cost a
bf16 ulp per step (``exp(x - m)`` loses 2% at x - m = -5), and numpy's own
ml_dtypes loops are slower than f32 anyway. An explicit ``cast(.., bf16)`` still
rounds where it stands. Callers that reduce the join (``wide=True``) take the f32
values and round after the reduction, so a sum rounds once, not once per term.
Integers compute exactly in their own dtype: the constants of an integer step are made
integers of it (typing checked that they are whole numbers, ir/scalar.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from einsummable.ir.dtypes import HALF, to_numpy
from einsummable.ir.expr import Cast, Const, Expr, Input, Var, children, inputs_used, variables_used
from einsummable.ir.scalar import _variable, dtype_of, parse, result_dtype, simplify
from einsummable.ir.scalar_ops import expand, is_call

Kernel = Callable[..., None]  # writes the op's value into its first argument, an ``out`` buffer
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
        root = expand(self.expr)  # a composite op (gelu) runs as its primitives' kernels
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
        elif (whole := self._integer_constant(e)) is not None:
            ref = ("const", whole)
        else:
            args = tuple(self._lower(k, memo) for k in children(e))
            dtype = self._dtype(e)
            if working(dtype).kind == "i":  # float constants would make numpy refuse the int buffer
                args = tuple(("const", working(dtype).type(v)) if kind == "const" else (kind, v)
                             for kind, v in args)
            if isinstance(e, Cast):
                rounds = e.dtype in HALF
                rule_kernel, inplace = (_rounding(to_numpy(e.dtype)) if rounds else _cast_kernel), False
            else:
                rule_kernel, inplace = KERNELS[e.op]
                if e.op == "pow":
                    args = (args[0], ("scalar", e.args[1].value))
            self._steps.append((rule_kernel, args, working(dtype), inplace))
            ref = ("reg", len(self._steps) - 1)
        memo[e] = ref
        return ref

    def _integer_constant(self, e: Expr) -> np.integer | None:
        """A constant subexpression of an integer step (``2 - 1`` in ``x0 + (2 - 1)``),
        folded: typing checked it is a whole number (ir/scalar.py)."""
        if isinstance(e, Cast) or inputs_used(e) or variables_used(e) or working(self._dtype(e)).kind != "i":
            return None
        folded = simplify(e)
        return working(self._dtype(e)).type(folded.value) if isinstance(folded, Const) else None

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


def _ufunc(uf: np.ufunc) -> Kernel:
    def kernel(out: np.ndarray, *args: np.ndarray) -> None:
        uf(*args, out=out)

    return kernel


def _one_plus_exp_neg(out: np.ndarray, a: np.ndarray) -> None:
    """1 + e^-a, in place: sigmoid is 1 / this, silu a / this (ir/scalar_ops.py's forms);
    e^-a overflows to inf past a = -88 (f32) by design, so numpy is not to warn."""
    np.negative(a, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    np.add(out, 1, out=out)


def _sigmoid(out: np.ndarray, a: np.ndarray) -> None:
    _one_plus_exp_neg(out, a)
    np.divide(1, out, out=out)


def _silu(out: np.ndarray, a: np.ndarray) -> None:
    _one_plus_exp_neg(out, a)
    np.divide(a, out, out=out)


def _rsqrt(out: np.ndarray, a: np.ndarray) -> None:
    np.sqrt(a, out=out)
    np.reciprocal(out, out=out)


def _relu(out: np.ndarray, a: np.ndarray) -> None:
    np.maximum(a, 0, out=out)


_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def _where_kernel(out: np.ndarray, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    # A bitwise select, (a & m) | (b & ~m) with m all ones where c holds: exact for every
    # value (nan and inf included) and branch-free; copyto(where=) on a random mask is ~10x slower.
    itype = _SAME_SIZE_INT.get(out.dtype.itemsize)
    if itype is None or out.dtype == np.bool_ or out.dtype.kind == "c":
        np.copyto(out, b)
        np.copyto(out, a, where=c)
        return
    mask = np.asarray(c).astype(itype)
    np.negative(mask, out=mask)
    bits = out.view(itype)
    np.bitwise_and(_bits(a, out.dtype, itype), mask, out=bits)
    if not (np.ndim(b) == 0 and float(b) == 0.0 and math.copysign(1.0, float(b)) > 0):
        np.bitwise_or(bits, np.bitwise_and(_bits(b, out.dtype, itype), np.invert(mask)), out=bits)


def _bits(x: np.ndarray | float, dtype: np.dtype, itype: type) -> np.ndarray:
    arr = np.asarray(x, dtype=dtype) if not isinstance(x, np.ndarray) or x.dtype != dtype else x
    return arr.view(itype)


def _real(out: np.ndarray, a: np.ndarray) -> None:
    np.copyto(out, np.real(a))


def _imag(out: np.ndarray, a: np.ndarray) -> None:
    np.copyto(out, np.imag(a))


def _copy(out: np.ndarray, a: np.ndarray) -> None:
    np.copyto(out, a)


def _pow_kernel(out: np.ndarray, a: np.ndarray, c: float) -> None:
    if c == 2:
        np.multiply(a, a, out=out)
    elif c == 0.5:
        np.sqrt(a, out=out)
    elif c == -1:
        np.reciprocal(a, out=out)
    elif c == 1:
        np.copyto(out, a)
    else:
        np.power(a, int(c) if out.dtype.kind == "i" else c, out=out)


_INPLACE = {name: (_ufunc(uf), True) for name, uf in {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "neg": np.negative,
    "abs": np.absolute, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos,
    "tanh": np.tanh, "min": np.minimum, "max": np.maximum, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal,
    "conj": np.conjugate}.items()}
# op name -> (its numpy kernel, whether it may write into a buffer one of its args occupies)
KERNELS: dict[str, tuple[Kernel, bool]] = _INPLACE | {
    "pow": (_pow_kernel, True),
    "rsqrt": (_rsqrt, True),
    "sigmoid": (_sigmoid, True),
    "silu": (_silu, False),
    "relu": (_relu, True),
    "where": (_where_kernel, False),
    "stop_gradient": (_copy, True),
    "real": (_real, True),
    "imag": (_imag, True),
}


def compile_expr(e: Expr | str, input_dtypes: Sequence[str]) -> Compiled:
    return Compiled(parse(e), input_dtypes)
