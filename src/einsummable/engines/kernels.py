"""Numpy kernels for every node kind, over whole tensors or single blocks.

Any einsummable runs: contractions go to ``np.einsum``/BLAS, everything else is
its compiled join over broadcast views followed by a ufunc reduction.

Half precision (f16, bf16) is computed and accumulated in f32 and rounded once,
when the kernel returns, as torch and JAX reduce: a bf16 sum of 4096 x 0.1 that
accumulated in bf16 would stall at 32. A half-precision partial sum that the
lowering keeps in f32 (the join wrapped in ``cast(.., f32)``) is the same kernel
without the final rounding.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from einsummable.engines import native
from einsummable.engines.gemm import contraction, upcast
from einsummable.engines.interpret import WIDE, Compiled
from einsummable.ir import scalar
from einsummable.ir.box import Box
from einsummable.ir.dtypes import HALF, to_numpy
from einsummable.ir.einsummable import IDENTITY, Einsummable, letter
from einsummable.ir.expr import ONE, ZERO, Cast, Const, Expr, Input, call, inputs_used, substitute
from einsummable.ir.graph import Constant, FillKind, Ramp, Tril
from einsummable.ir.scalar_ops import is_call

REDUCE = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


@functools.lru_cache(maxsize=4096)
def compiled(join: Expr, dtypes: tuple[str, ...]) -> Compiled:
    return Compiled(join, dtypes)


def accumulator(op: Einsummable) -> np.dtype | None:
    """The dtype a sum or product of ``op`` accumulates in, when it is not its own:
    f32 for the half types (a min or max is exact in any)."""
    return WIDE if op.dtype in HALF and op.agg in ("add", "mul") else None


def kept_wide(op: Einsummable) -> Einsummable | None:
    """The half-precision op inside ``cast(join, f32)``, a partial sum the lowering keeps
    in f32 until its formation rounds it once; None for any other op."""
    join = op.join
    if not (isinstance(join, Cast) and join.dtype == "f32" and op.agg in ("add", "mul")):
        return None
    inner = Einsummable(op.join_shape, op.inputs, op.out_rank, join.arg, op.agg, op.dtypes)
    return inner if inner.dtype in HALF else None


def einsum(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
    """Evaluate ``op`` on arrays shaped like its inputs; returns a fresh array."""
    result = np.broadcast_to(_evaluate(kept_wide(op) or op, arrays, variables), op.out_shape)
    return np.array(result, dtype=to_numpy(op.dtype), copy=True)


def _evaluate(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None) -> np.ndarray:
    """``einsum`` before its final rounding: half precision comes back in f32."""
    covered = set(range(op.out_rank)) <= {i for idx in op.inputs for i in idx}
    plain = len(op.inputs) == 1 and op.join == IDENTITY and op.agg in (None, "add")
    if covered and (op.is_contraction() or plain):
        arrays = upcast(arrays)
        subs = ",".join("".join(letter(i) for i in idx) for idx in op.inputs)
        out = "".join(letter(i) for i in range(op.out_rank))
        return np.einsum(f"{subs}->{out}", *arrays, optimize=len(arrays) > 1)
    if math.prod(op.join_shape) > JOIN_LIMIT and op.out_rank and op.join_shape[0] > 1:
        return _in_slabs(op, arrays, variables)
    views = [_align(a, idx, op.join_shape) for a, idx in zip(arrays, op.inputs, strict=True)]
    joined = compiled(op.join, op.dtypes)(*views, variables=variables, wide=op.agg is not None)
    if op.agg is not None:
        joined = REDUCE[op.agg].reduce(joined, axis=op.aggregated, dtype=accumulator(op))
    return joined


JOIN_LIMIT = 1 << 24  # join-space elements the reference materialises at once


def _in_slabs(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None) -> np.ndarray:
    """The same op, slab by slab along its first output index, so memory stays bounded."""
    n = op.join_shape[0]
    step = max(1, n * JOIN_LIMIT // math.prod(op.join_shape))
    parts = []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        sliced = [a[tuple(slice(lo, hi) if i == 0 else slice(None) for i in idx)]
                  for a, idx in zip(arrays, op.inputs, strict=True)]
        block = op.block((hi - lo, *op.join_shape[1:]))
        parts.append(np.broadcast_to(_evaluate(block, sliced, variables), block.out_shape))
    return np.concatenate(parts, axis=0)


def _alignment(idx: tuple[int, ...], join_shape: tuple[int, ...]) -> tuple[list[int], tuple[int, ...]]:
    """The transpose and reshape that view an operand with its axes in join order and
    size-1 axes for the indices it lacks; kernels work it out once, at prepare."""
    axes = sorted(range(len(idx)), key=idx.__getitem__)
    return axes, tuple(n if i in idx else 1 for i, n in enumerate(join_shape))


def _align(a: np.ndarray, idx: tuple[int, ...], join_shape: tuple[int, ...]) -> np.ndarray:
    axes, shape = _alignment(idx, join_shape)
    return a.transpose(axes).reshape(shape)


def fill(kind: FillKind, dtype: str, box: Box) -> np.ndarray:
    """The block ``box`` of a fill; the whole fill when box covers its shape."""
    shape = tuple(hi - lo for lo, hi in box)
    np_dtype = to_numpy(dtype)
    if isinstance(kind, Constant):
        return np.full(shape, kind.value, dtype=np_dtype)
    if isinstance(kind, Tril):
        (r0, r1), (c0, c1) = box[-2:]
        rows = np.arange(r0, r1)[:, None]
        cols = np.arange(c0, c1)[None, :]
        mask = (cols - rows) <= kind.offset
        plane = np.where(mask, kind.inside, kind.outside).astype(np_dtype)
        return np.ascontiguousarray(np.broadcast_to(plane, shape))
    assert isinstance(kind, Ramp)
    out = np.full(shape, kind.start, dtype=np.float64)
    for d, ((lo, hi), step) in enumerate(zip(box, kind.steps, strict=True)):
        if step:
            view = [1] * len(shape)
            view[d] = hi - lo
            out = out + step * np.arange(lo, hi, dtype=np.float64).reshape(view)
    return out.astype(np_dtype)


Kernel = Callable[[Sequence[np.ndarray], dict | None], np.ndarray]


@functools.lru_cache(maxsize=8192)
def prepare(op: Einsummable) -> Kernel:
    """The engines' kernel for ``op``, chosen once: BLAS for contractions, gathers for
    equality joins, compiled joins for the rest.

    Contractions lower to transpose + reshape + ``np.matmul`` (batched GEMM), which
    measured far faster here than ``np.einsum``. The result may be a read-only view
    (of an input, or broadcast); engines never write into blocks they did not make.
    """
    dtype = to_numpy(op.dtype)
    body = _body(kept_wide(op) or op)
    shape = op.out_shape

    def kernel(arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
        result = body(arrays, variables)
        if result.dtype != dtype:
            result = result.astype(dtype)  # half precision rounds here, once
        return result if result.shape == shape else np.broadcast_to(result, shape)

    return kernel


def _body(op: Einsummable) -> Kernel:
    """The kernel's work, before its cast to ``op.dtype``: half precision stays in f32."""
    match = equality_gather(op)
    acc = accumulator(op)
    if op.is_contraction() and _inner_size(op) > TINY_INNER:
        body = contraction(op)
    elif match is not None:
        def body(arrays, variables):
            return _gather(op, arrays, *match)
    elif len(op.inputs) == 1 and op.agg is None and op.join in (IDENTITY, Cast(op.dtype, IDENTITY)):
        def body(arrays, variables):  # a cast is the kernel's own final astype
            return _align(arrays[0], op.inputs[0], op.join_shape)
    elif op.join == IDENTITY and len(op.inputs) == 1:
        reduce = REDUCE[op.agg].reduce if op.agg else None

        def body(arrays, variables):
            view = _align(arrays[0], op.inputs[0], op.join_shape)
            return reduce(view, axis=op.aggregated, dtype=acc) if reduce else view
    elif _aggregated_size(op) > 0 and (split := _outer_factors(op)) is not None:
        body = _factored(op, *split)
    elif op.agg and 0 < _aggregated_size(op) <= TINY_INNER:  # (an empty sum is the generic path's)
        body = _native(op, _small_reduce(op))
    else:
        fn = compiled(op.join, op.dtypes)
        reduce = REDUCE[op.agg].reduce if op.agg else None
        order = _traversal(op)
        summed = tuple(k for k, i in enumerate(order) if i >= op.out_rank)
        back = tuple(np.argsort([i for i in order if i < op.out_rank]))

        aligned = [_alignment(idx, op.join_shape) for idx in op.inputs]

        def body(arrays, variables):
            views = [a.transpose(axes).reshape(shape).transpose(order)
                     for a, (axes, shape) in zip(arrays, aligned, strict=True)]
            result = fn(*views, variables=variables, wide=reduce is not None)
            return (reduce(result, axis=summed, dtype=acc) if reduce else result).transpose(back)

        body = _native(op, body)
    return body


def _native(op: Einsummable, body: Kernel) -> Kernel:
    """The generated C kernel where the join has one. Half-precision ops keep the numpy
    path: the C code rounds every step of a half join to its dtype, while the engines
    compute half joins in f32 and round once (design.md), which the tests hold them to."""
    if {"f16", "bf16"} & {op.dtype, *op.dtypes}:
        return body
    return native.kernel(op, body)


def fast_einsum(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
    """Run the prepared kernel once; into ``out`` when given."""
    result = prepare(op)(arrays, variables)
    if out is None:
        return result
    np.copyto(out, result, casting="unsafe")
    return out


TINY_INNER = 8  # below this contracted size a GEMM per tiny matrix loses to multiply-and-sum


def _outer_factors(op: Einsummable) -> tuple[Expr, Expr] | None:
    """Split a summed product into (factors constant along the sum, the rest).

    ``sum_t -(g[t] * p[t]) / s**2`` is ``-1 / s**2`` times the contraction ``sum_t g[t] p[t]``:
    the outer factors run once per output element, not once per summand, and what is
    left is often a plain contraction for BLAS.
    """
    if op.agg != "add":
        return None
    factors: list[tuple[Expr, bool]] = []
    _factor(op.join, False, factors)
    outer = [(f, inv) for f, inv in factors
             if all(max(op.inputs[k], default=-1) < op.out_rank for k in inputs_used(f))]
    inner = [(f, inv) for f, inv in factors if (f, inv) not in outer]
    if not outer or not inner:
        return None
    return _product(outer), _product(inner)


def _factor(e: Expr, inverse: bool, out: list[tuple[Expr, bool]]) -> None:
    if is_call(e, "mul"):
        for a in e.args:
            _factor(a, inverse, out)
    elif is_call(e, "div"):
        _factor(e.args[0], inverse, out)
        _factor(e.args[1], not inverse, out)
    elif is_call(e, "neg"):
        out.append((Const(-1.0), False))
        _factor(e.args[0], inverse, out)
    elif e != ONE:  # a bare 1 is no factor: 1 / x must not split into 1 and 1 / x again
        out.append((e, inverse))


def _product(factors: list[tuple[Expr, bool]]) -> Expr:
    def chain(es: list[Expr]) -> Expr:
        return functools.reduce(lambda a, b: call("mul", a, b), es) if es else ONE

    num, den = chain([f for f, inv in factors if not inv]), [f for f, inv in factors if inv]
    return call("div", num, chain(den)) if den else num


def _factored(op: Einsummable, outer: Expr, inner: Expr) -> Kernel:
    """``outer * sum(inner)``, each an einsummable over the operands it reads."""
    parts = []
    for expr, shape, agg in ((inner, op.join_shape, "add"), (outer, op.out_shape, None)):
        used = sorted(inputs_used(expr))
        renumbered = substitute(expr, {k: Input(j) for j, k in enumerate(used)})
        if used:
            part = Einsummable(shape, tuple(op.inputs[k] for k in used), op.out_rank, renumbered, agg,
                               tuple(op.dtypes[k] for k in used))
            parts.append((_body(part), used))
        else:  # constants and run-time variables only
            parts.append((renumbered, used))
    (summed, s_used), (scale, o_used) = parts

    def body(arrays, variables):
        total = summed([arrays[k] for k in s_used], variables)
        if not o_used:  # folded in double precision; a Python number keeps total's dtype
            return total * scalar.constant_value(scale, variables)
        return np.multiply(total, scale([arrays[k] for k in o_used], variables))  # rounded once, after

    return body


def _traversal(op: Einsummable) -> tuple[int, ...]:
    """The join axes in the order a reduction walks them: its largest operand's memory order.

    RMSNorm's weight gradient sums [b, s, d] over b and s into [d]; walked in join
    order (d first) every step strides through memory, walked as stored it streams.
    Elementwise joins keep the output's order, which their consumers read row-major.
    """
    if op.agg is None or not op.inputs:
        return tuple(range(op.rank))
    biggest = max(op.inputs, key=lambda idx: math.prod(op.join_shape[i] for i in idx))
    return (*biggest, *(i for i in range(op.rank) if i not in biggest))


def _aggregated_size(op: Einsummable) -> int:
    return math.prod(op.join_shape[op.out_rank :])


def _small_reduce(op: Einsummable) -> Kernel:
    """A reduction over a handful of values (RoPE's 2x2 rotation sums over 2): one join per
    aggregated position, folded into the output, so the join space is never formed and
    no ufunc reduces along a short strided axis."""
    fn, combine, acc = compiled(op.join, op.dtypes), REDUCE[op.agg], accumulator(op)
    positions = list(itertools.product(*(range(n) for n in op.join_shape[op.out_rank :])))
    keep = (slice(None),) * op.out_rank

    def body(arrays, variables):
        views = [_align(a, idx, op.join_shape) for a, idx in zip(arrays, op.inputs, strict=True)]
        out = None
        for at in positions:
            term = fn(*(v[keep + _at(at, v.shape[op.out_rank :])] for v in views),
                      variables=variables, wide=True)
            if out is None:
                out = term if acc is None else np.asarray(term, dtype=acc)
            else:
                combine(out, term, out=out)  # every term has one shape
        return out

    return body


def _at(position: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The index of ``position`` in a view that may broadcast (size 1) along some axes."""
    return tuple(k if n > 1 else 0 for k, n in zip(position, sizes, strict=True))


def _inner_size(op: Einsummable) -> int:
    """The size of what a contraction sums over (RoPE's 2x2 rotation sums over 2)."""
    (ia, ib) = op.inputs
    n = 1
    for i in set(ia) & set(ib) - set(range(op.out_rank)):
        n *= op.join_shape[i]
    return n


def equality_gather(op: Einsummable) -> tuple[int, int, int] | None:
    """Match ``sum where(xa == xb, xc, 0)``: an embedding lookup or its scatter-add gradient."""
    e = op.join
    if op.agg != "add" or len(op.inputs) != 3 or not is_call(e, "where"):
        return None
    cond, then, other = e.args
    if not (is_call(cond, "eq") and other == ZERO and isinstance(then, Input)):
        return None
    a, b = cond.args
    if not (isinstance(a, Input) and isinstance(b, Input)):
        return None
    if len({a.index, b.index, then.index}) != 3 or not (op.inputs[a.index] or op.inputs[b.index]):
        return None
    return a.index, b.index, then.index


def _gather(op: Einsummable, arrays: Sequence[np.ndarray], a: int, b: int, c: int) -> np.ndarray:
    """Find the (few) places where xa == xb, then gather xc there and scatter-add into the output.

    Costs |xa x xb| comparisons plus the gathered bytes, not the join space: an
    embedding of t tokens from a v x d table never touches t x v x d.
    """
    rank, outs = op.rank, set(range(op.out_rank))
    m_idx = sorted(set(op.inputs[a]) | set(op.inputs[b]))
    mask = _align(arrays[a], op.inputs[a], op.join_shape) == _align(arrays[b], op.inputs[b], op.join_shape)
    mask = np.broadcast_to(mask, [op.join_shape[i] if i in m_idx else 1 for i in range(rank)])
    coords = dict(zip(m_idx, np.nonzero(mask.reshape([op.join_shape[i] for i in m_idx])), strict=True))
    c_idx = op.inputs[c]
    xc, acc = arrays[c], accumulator(op)
    summed = tuple(k for k, i in enumerate(c_idx) if i not in outs and i not in coords)
    if summed:
        xc = xc.sum(axis=summed, dtype=acc)
        c_idx = tuple(i for i in c_idx if i in outs or i in coords)
    fixed_c = [i for i in c_idx if i in coords]
    free = [i for i in c_idx if i not in coords]
    xc = xc.transpose([c_idx.index(i) for i in fixed_c + free])
    gathered = xc[tuple(coords[i] for i in fixed_c)]
    if not fixed_c:
        gathered = np.broadcast_to(gathered, (len(next(iter(coords.values()))), *gathered.shape))
    fixed_out = [i for i in range(op.out_rank) if i in coords]
    if fixed_out:
        target = np.zeros([op.join_shape[i] for i in fixed_out + free], dtype=acc or gathered.dtype)
        np.add.at(target, tuple(coords[i] for i in fixed_out), gathered)
    else:
        target = gathered.sum(axis=0, dtype=acc)
    present = fixed_out + free
    target = target.transpose([present.index(i) for i in sorted(present)])
    return target.reshape([op.join_shape[i] if i in present else 1 for i in range(op.out_rank)])
