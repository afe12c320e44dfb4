"""Numpy kernels for every node kind, over whole tensors or single blocks.

Any einsummable runs: contractions go to ``np.einsum``/BLAS, everything else is
its compiled join over broadcast views followed by a ufunc reduction.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from einsummable.engines import native
from einsummable.ir import scalar
from einsummable.ir.box import Box
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import IDENTITY, Einsummable, letter
from einsummable.ir.expr import ONE, ZERO, Const, Expr, Input, call, inputs_used, substitute
from einsummable.ir.graph import Constant, FillKind, Ramp, Tril
from einsummable.ir.scalar_ops import is_call

REDUCE = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


@functools.lru_cache(maxsize=4096)
def compiled(join: Expr, dtypes: tuple[str, ...]) -> scalar.Compiled:
    return scalar.Compiled(join, dtypes)


def einsum(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
    """Evaluate ``op`` on arrays shaped like its inputs; returns a fresh array."""
    covered = set(range(op.out_rank)) <= {i for idx in op.inputs for i in idx}
    plain = len(op.inputs) == 1 and op.join == IDENTITY and op.agg in (None, "add")
    if covered and (op.is_contraction() or plain):
        arrays = _upcast(arrays)
        subs = ",".join("".join(letter(i) for i in idx) for idx in op.inputs)
        out = "".join(letter(i) for i in range(op.out_rank))
        result = np.einsum(f"{subs}->{out}", *arrays, optimize=len(arrays) > 1)
        result = np.broadcast_to(result, op.out_shape)
        return np.array(result, dtype=to_numpy(op.dtype), copy=True)
    if math.prod(op.join_shape) > JOIN_LIMIT and op.out_rank and op.join_shape[0] > 1:
        return _in_slabs(op, arrays, variables)
    views = [_align(a, idx, op.join_shape) for a, idx in zip(arrays, op.inputs, strict=True)]
    fn = compiled(op.join, op.dtypes)
    joined = fn(*views, variables=variables)
    if op.agg is not None:
        joined = REDUCE[op.agg].reduce(joined, axis=op.aggregated)
    joined = np.broadcast_to(joined, op.out_shape)
    return np.array(joined, dtype=to_numpy(op.dtype), copy=True)


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
        parts.append(einsum(op.block((hi - lo, *op.join_shape[1:])), sliced, variables))
    return np.concatenate(parts, axis=0)


def _upcast(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Half-precision operands go to BLAS as f32: numpy has no f16/bf16 GEMM worth the name."""
    return [a.astype(np.float32) if a.dtype.itemsize == 2 and a.dtype.kind != "i" else a for a in arrays]


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
    match = equality_gather(op)
    if op.is_contraction() and _inner_size(op) > TINY_INNER:
        body = _contraction(op)
    elif match is not None:
        def body(arrays, variables):
            return _gather(op, arrays, *match)
    elif op.join == IDENTITY and len(op.inputs) == 1:
        reduce = REDUCE[op.agg].reduce if op.agg else None

        def body(arrays, variables):
            view = _align(arrays[0], op.inputs[0], op.join_shape)
            return reduce(view, axis=op.aggregated) if reduce else view
    elif _aggregated_size(op) > 0 and (split := _outer_factors(op)) is not None:
        body = _factored(op, *split)
    elif op.agg and 0 < _aggregated_size(op) <= TINY_INNER:  # (an empty sum is the generic path's)
        body = native.kernel(op, _small_reduce(op))
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
            result = fn(*views, variables=variables)
            return (reduce(result, axis=summed) if reduce else result).transpose(back)

        body = native.kernel(op, body)  # the generated C kernel, where the join has one

    shape = op.out_shape

    def kernel(arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
        result = body(arrays, variables)
        if result.dtype != dtype:
            result = result.astype(dtype)
        return result if result.shape == shape else np.broadcast_to(result, shape)

    return kernel


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
            parts.append((prepare(part), used))
        else:  # constants and run-time variables only
            parts.append((renumbered, used))
    (summed, s_used), (scale, o_used) = parts

    def body(arrays, variables):
        total = summed([arrays[k] for k in s_used], variables)
        if not o_used:  # folded in double precision; a Python number keeps total's dtype
            return total * scalar.constant_value(scale, variables)
        return np.multiply(total, scale([arrays[k] for k in o_used], variables))

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
    fn, combine = compiled(op.join, op.dtypes), REDUCE[op.agg]
    positions = list(itertools.product(*(range(n) for n in op.join_shape[op.out_rank :])))
    keep = (slice(None),) * op.out_rank

    def body(arrays, variables):
        views = [_align(a, idx, op.join_shape) for a, idx in zip(arrays, op.inputs, strict=True)]
        out = None
        for at in positions:
            term = fn(*(v[keep + _at(at, v.shape[op.out_rank :])] for v in views), variables=variables)
            out = term if out is None else combine(out, term, out=out)  # every term has one shape
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


def _contraction(op: Einsummable) -> Kernel:
    """A pairwise contraction as one batched GEMM; its index bookkeeping is done here, once."""
    (ia, ib) = op.inputs
    sa, sb, out = set(ia), set(ib), set(range(op.out_rank))
    # indices summed inside one operand alone are reduced before the GEMM
    lone_a = tuple(k for k, i in enumerate(ia) if i not in sb | out)
    lone_b = tuple(k for k, i in enumerate(ib) if i not in sa | out)
    ia, ib = tuple(i for i in ia if i in sb | out), tuple(i for i in ib if i in sa | out)
    sa, sb = set(ia), set(ib)
    batch = [i for i in range(op.out_rank) if i in sa and i in sb]
    left = [i for i in range(op.out_rank) if i in sa and i not in sb]
    right = [i for i in range(op.out_rank) if i in sb and i not in sa]
    # (B A) rather than (A B) lands the GEMM's rows and columns in output order
    swap = bool(left and right and right[0] < left[0])
    if swap:
        ia, ib, sa, sb, left, right = ib, ia, sb, sa, right, left
    inner = [i for i in ia if i in sb and i not in out]
    if not _sorted(batch + left + right):
        # the result is transposed anyway: take rows and columns in their operands' memory order
        left, right = [i for i in ia if i in left], [i for i in ib if i in right]
    size = op.join_shape
    order = batch + left + right
    grid = [size[i] for i in order]
    present = [i for i in range(op.out_rank) if i in order]
    perm = [order.index(i) for i in present]
    transpose = not _sorted(perm)
    shape = [size[i] if i in order else 1 for i in range(op.out_rank)]
    as_a = _matrices(ia, batch, left, inner, size)
    as_b = _matrices(ib, batch, inner, right, size)

    def body(arrays, variables):
        a, b = _upcast(arrays)
        if lone_a:
            a = a.sum(axis=lone_a)
        if lone_b:
            b = b.sum(axis=lone_b)
        if swap:
            a, b = b, a
        c = np.matmul(as_a(a), as_b(b)).reshape(grid)
        if transpose:
            c = np.ascontiguousarray(c.transpose(perm))  # elementwise kernels downstream read it row-major
        return c.reshape(shape)

    return body


def _sorted(xs: list[int]) -> bool:
    return all(x < y for x, y in itertools.pairwise(xs))


def _matrices(idx: tuple[int, ...], batch: list[int], rows: list[int], cols: list[int],
              size: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """An operand as a stack of rows x cols matrices, [*batch, R, C], for ``np.matmul``.

    A view where the layout allows: batch axes keep any strides, and BLAS reads a
    matrix stored either way round, so only an operand whose rows or columns are
    split apart in memory is copied.
    """
    lead, perm = [size[i] for i in batch], [idx.index(i) for i in batch + rows + cols]
    shape = (*lead, _prod(size, rows), _prod(size, cols))

    def matrices(x: np.ndarray) -> np.ndarray:
        try:
            view = np.reshape(x.transpose(perm), shape, copy=False)
            if _blas_ready(view):
                return view
        except ValueError:
            pass
        return np.ascontiguousarray(x.transpose(perm)).reshape(shape)

    return matrices


def _blas_ready(m: np.ndarray) -> bool:
    """Whether numpy's matmul hands these matrices to BLAS as they are (one unit-stride axis)."""
    item = m.itemsize
    (rs, cs), (r, c) = m.strides[-2:], m.shape[-2:]
    row_major = cs == item and rs % item == 0 and rs >= c * item
    return row_major or (rs == item and cs % item == 0 and cs >= r * item)


def _prod(size: tuple[int, ...], idx: list[int]) -> int:
    n = 1
    for i in idx:
        n *= size[i]
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
    xc = arrays[c]
    summed = tuple(k for k, i in enumerate(c_idx) if i not in outs and i not in coords)
    if summed:
        xc = xc.sum(axis=summed)
        c_idx = tuple(i for i in c_idx if i in outs or i in coords)
    fixed_c = [i for i in c_idx if i in coords]
    free = [i for i in c_idx if i not in coords]
    xc = xc.transpose([c_idx.index(i) for i in fixed_c + free])
    gathered = xc[tuple(coords[i] for i in fixed_c)]
    if not fixed_c:
        gathered = np.broadcast_to(gathered, (len(next(iter(coords.values()))), *gathered.shape))
    fixed_out = [i for i in range(op.out_rank) if i in coords]
    if fixed_out:
        target = np.zeros([op.join_shape[i] for i in fixed_out + free], dtype=gathered.dtype)
        np.add.at(target, tuple(coords[i] for i in fixed_out), gathered)
    else:
        target = gathered.sum(axis=0)
    present = fixed_out + free
    target = target.transpose([present.index(i) for i in sorted(present)])
    return target.reshape([op.join_shape[i] if i in present else 1 for i in range(op.out_rank)])
