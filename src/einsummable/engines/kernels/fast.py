"""The engines' fast kernels: ``prepare(op)`` picks once per block op how it runs.

BLAS for contractions, gathers for equality joins, factored or unrolled reductions,
generated C where the join has it, and the interpreted numpy join for the rest. Every
choice computes what the reference kernel (reference_kernel.py) computes; half
precision is computed in f32 and rounded once, when the kernel returns.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from einsummable.engines.kernels import cbuild, native
from einsummable.engines.kernels.gemm import contraction
from einsummable.engines.kernels.reference import REDUCE, accumulator, align, alignment, compiled, kept_wide
from einsummable.ir import kinds, scalar
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import IDENTITY, Einsummable
from einsummable.ir.expr import ONE, Cast, Const, Expr, Input, call, inputs_used, substitute
from einsummable.ir.scalar_ops import is_call

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

    # the C function alone computes the kernel (no cast, no wider op): a native task loop
    # may call it itself (segment.py)
    kernel.compiled = body if isinstance(body, native._Compiled) and body.op == op \
        and body.acc_dtype == dtype else None
    return kernel


def _body(op: Einsummable) -> Kernel:
    """The kernel's work, before its cast to ``op.dtype``: half precision stays in f32."""
    match = kinds.equality_gather(op)
    acc = accumulator(op)
    if _runs_gemm(op):
        body = contraction(op)
    elif match is not None:
        def body(arrays, variables):
            return _gather(op, arrays, *match)
    elif len(op.inputs) == 1 and op.agg is None and op.join in (IDENTITY, Cast(op.dtype, IDENTITY)):
        def body(arrays, variables):  # a cast is the kernel's own final astype
            return align(arrays[0], op.inputs[0], op.join_shape)
    elif op.join == IDENTITY and len(op.inputs) == 1:
        reduce = REDUCE[op.agg].reduce if op.agg else None

        def body(arrays, variables):
            view = align(arrays[0], op.inputs[0], op.join_shape)
            return reduce(view, axis=op.aggregated, dtype=acc) if reduce else view

        if reduce:  # a row max or sum: the C kernel's lanes, not a ufunc's reduce (0.035 ms vs 0.083)
            body = _native(op, body)
    elif (parts := factored_parts(op)) is not None:
        body = _factored(parts)
    elif op.agg and 0 < _aggregated_size(op) <= kinds.TINY_INNER:  # (an empty sum is the generic path's)
        body = _native(op, _small_reduce(op))
    else:
        fn = compiled(op.join, op.dtypes)
        reduce = REDUCE[op.agg].reduce if op.agg else None
        order = _traversal(op)
        summed = tuple(k for k, i in enumerate(order) if i >= op.out_rank)
        back = tuple(np.argsort([i for i in order if i < op.out_rank]))

        aligned = [alignment(idx, op.join_shape) for idx in op.inputs]

        def body(arrays, variables):
            views = [a.transpose(axes).reshape(shape).transpose(order)
                     for a, (axes, shape) in zip(arrays, aligned, strict=True)]
            result = fn(*views, variables=variables, wide=reduce is not None)
            return (reduce(result, axis=summed, dtype=acc) if reduce else result).transpose(back)

        body = _native(op, body)
    return body


def _native(op: Einsummable, body: Kernel) -> Kernel:
    """The generated C kernel where the join has one. Half precision computes there as
    here: in f32, rounded at explicit casts and once by ``prepare``'s final cast. f16
    stays on numpy: gcc 12 converts ``_Float16`` by library calls, 3x slower than numpy
    (silu(x) * y over 1.4M f16: 22.8 ms against 7.1; bf16 runs 0.57 ms against 3.1)."""
    if "f16" in (op.dtype, *op.dtypes):
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


Part = tuple[Einsummable | Expr, list[int]]


def factored_parts(op: Einsummable) -> tuple[Part, Part] | None:
    """Where ``prepare`` runs ``op`` as ``outer * sum(inner)`` (``_outer_factors``): the sum of the
    inner factors and the outer factors, each an einsummable over the operands it reads (their
    positions beside it), or an Expr of constants and run-time variables where it reads none."""
    split = _outer_factors(op) if _aggregated_size(op) > 0 else None
    if split is None:
        return None
    outer, inner = split
    parts = []
    for expr, shape, agg in ((inner, op.join_shape, "add"), (outer, op.out_shape, None)):
        used = sorted(inputs_used(expr))
        renumbered = substitute(expr, {k: Input(j) for j, k in enumerate(used)})
        if used:
            parts.append((Einsummable(shape, tuple(op.inputs[k] for k in used), op.out_rank, renumbered, agg,
                                      tuple(op.dtypes[k] for k in used)), used))
        else:  # constants and run-time variables only
            parts.append((renumbered, used))
    return parts[0], parts[1]


def _factored(parts: tuple[Part, Part]) -> Kernel:
    """``outer * sum(inner)``, each an einsummable over the operands it reads."""
    (inner, s_used), (outer, o_used) = parts
    summed = _body(inner)
    scale = _body(outer) if o_used else outer

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
        views = [align(a, idx, op.join_shape) for a, idx in zip(arrays, op.inputs, strict=True)]
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


def _runs_gemm(op: Einsummable) -> bool:
    """A GEMM (``kinds.is_gemm``), or a row-wise dot no C kernel will run (compiled kernels off,
    f16): a batched GEMM of 1 x n by n x 1 matrices beats numpy's product-then-sum. Where C runs
    it, one pass over both operands wins (1024 rows of 256: 0.022 ms against 0.026)."""
    if kinds.is_gemm(op):
        return True
    return (op.is_contraction() and kinds.inner_size(op) > kinds.TINY_INNER and kinds.rowwise_dot(op)
            and not (cbuild.enabled() and "f16" not in (op.dtype, *op.dtypes)))


def _gather(op: Einsummable, arrays: Sequence[np.ndarray], a: int, b: int, c: int) -> np.ndarray:
    """Find the (few) places where xa == xb, then gather xc there and scatter-add into the output.

    Costs |xa x xb| comparisons plus the gathered bytes, not the join space: an
    embedding of t tokens from a v x d table never touches t x v x d.
    """
    rank, outs = op.rank, set(range(op.out_rank))
    m_idx = sorted(set(op.inputs[a]) | set(op.inputs[b]))
    mask = align(arrays[a], op.inputs[a], op.join_shape) == align(arrays[b], op.inputs[b], op.join_shape)
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
        _scatter(target, tuple(coords[i] for i in fixed_out), gathered)
    else:
        target = gathered.sum(axis=0, dtype=acc)
    present = fixed_out + free
    target = target.transpose([present.index(i) for i in sorted(present)])
    return target.reshape([op.join_shape[i] if i in present else 1 for i in range(op.out_rank)])


def _scatter(target: np.ndarray, places: tuple[np.ndarray, ...], rows: np.ndarray) -> None:
    """``np.add.at(target, places, rows)`` on a zero target, without np.add.at: it holds the
    GIL and adds row by row (a Llama step's 1024 x 512 lookup: 3.5 ms; its gradient, 1024
    rows into 256 places: 3.5 ms, 1.5 so; 4096 rows of 256 into 32000 places: 9.2 and 6.3).
    One stable sort of the flat places: where none repeats (a lookup) the rows are assigned
    (x, where 0 + x gave +0 for -0); else each run of equal places is summed by one
    ``np.add.reduceat``, a reassociated sum, as every add aggregation is."""
    flat = np.ravel_multi_index(places, target.shape[: len(places)])
    cells = target.reshape(-1, *target.shape[len(places):])
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    repeats = ordered[1:] == ordered[:-1]
    if not repeats.any():
        cells[flat] = rows
        return
    starts = np.flatnonzero(np.concatenate(([True], ~repeats)))
    cells[ordered[starts]] = np.add.reduceat(rows[order], starts, axis=0, dtype=target.dtype)
