"""Graph, Tensor and the primitive builders every other helper is written with.

Every operation here appends EinGraph nodes; shapes and dtypes are checked as the
nodes are made, so a mistake surfaces at the line that wrote it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from einsummable.errors import DtypeError, GraphError, ShapeError
from einsummable.ir import scalar
from einsummable.ir.box import whole
from einsummable.ir.dot import render, to_dot
from einsummable.ir.dtypes import DEFAULT, canonical, common_float
from einsummable.ir.einsummable import IDENTITY, Einsummable
from einsummable.ir.expr import Cast, Const, Expr, Input, Var, substitute
from einsummable.ir.graph import (
    ComplexView,
    Constant,
    EinGraph,
    EinsumNode,
    Fill,
    FillKind,
    Formation,
    InputNode,
    Piece,
    Ramp,
    Reshape,
    Select,
    Tril,
    to_shape,
)
from einsummable.ir.syntax import check_variable_name

Scalar = int | float | complex


class Graph:
    """Builds an EinGraph: ``x = g.input("x", (4, 8))``, then ops, then ``g.output``."""

    def __init__(self) -> None:
        self.ir = EinGraph()

    def input(self, name: str, shape: Sequence[int], dtype: str = DEFAULT) -> Tensor:
        return self._add(InputNode(name, to_shape(shape), canonical(dtype)))

    def output(self, name: str, t: Tensor) -> None:
        self._own(t)
        self.ir.set_output(name, t.id)

    def fill(self, kind: FillKind, shape: Sequence[int], dtype: str = DEFAULT) -> Tensor:
        return self._add(Fill(kind, to_shape(shape), canonical(dtype)))

    def full(self, shape: Sequence[int], value: Scalar, dtype: str = DEFAULT) -> Tensor:
        return self.fill(Constant(value), shape, dtype)

    def zeros(self, shape: Sequence[int], dtype: str = DEFAULT) -> Tensor:
        return self.full(shape, 0.0, dtype)

    def tril(self, shape: Sequence[int], inside: float = 1.0, outside: float = 0.0,
             offset: int = 0, dtype: str = DEFAULT) -> Tensor:
        return self.fill(Tril(inside, outside, offset), shape, dtype)

    def ramp(self, shape: Sequence[int], steps: Sequence[float], start: float = 0.0,
             dtype: str = DEFAULT) -> Tensor:
        return self.fill(Ramp(start, tuple(float(s) for s in steps)), shape, dtype)

    def _add(self, node) -> Tensor:
        return Tensor(self, self.ir.add(node))

    def _own(self, t: Tensor) -> None:
        if not isinstance(t, Tensor):
            raise GraphError(f"expected a Tensor, got {type(t).__name__}")
        if t.graph is not self:
            raise GraphError("tensor belongs to a different Graph")

    @property
    def inputs(self) -> dict[str, Tensor]:
        return {name: Tensor(self, nid) for name, nid in self.ir.input_ids().items()}

    def __str__(self) -> str:
        return str(self.ir)

    def to_dot(self) -> str:
        return to_dot(self.ir)

    def render(self, path: str) -> str:
        """Draw the graph to an .svg/.png/.pdf with Graphviz; without it, warn once and write
        the DOT text to ``path + ".dot"``. Returns the path written."""
        return str(render(to_dot(self.ir), path))


class Tensor:
    """A handle on one EinGraph node. Operators and methods append nodes."""

    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # numpy scalars defer to our reflected operators

    def __init__(self, graph: Graph, nid: int) -> None:
        self.graph = graph
        self.id = nid

    @property
    def node(self):
        return self.graph.ir.nodes[self.id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> str:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"Tensor(%{self.id}, {self.dtype}{list(self.shape)})"

    __hash__ = object.__hash__

    # arithmetic, numpy broadcasting
    def __add__(self, o): return elementwise("x0 + x1", self, o)
    def __radd__(self, o): return elementwise("x0 + x1", o, self)
    def __sub__(self, o): return elementwise("x0 - x1", self, o)
    def __rsub__(self, o): return elementwise("x0 - x1", o, self)
    def __mul__(self, o): return elementwise("x0 * x1", self, o)
    def __rmul__(self, o): return elementwise("x0 * x1", o, self)
    def __truediv__(self, o): return elementwise("x0 / x1", self, o)
    def __rtruediv__(self, o): return elementwise("x0 / x1", o, self)
    def __neg__(self): return elementwise("-x0", self)
    def __abs__(self): return elementwise("abs(x0)", self)
    def __lt__(self, o): return elementwise("x0 < x1", self, o)
    def __le__(self, o): return elementwise("x0 <= x1", self, o)
    def __gt__(self, o): return elementwise("x0 > x1", self, o)
    def __ge__(self, o): return elementwise("x0 >= x1", self, o)
    def __eq__(self, o): return elementwise("x0 == x1", self, o)  # type: ignore[override]
    def __ne__(self, o): return elementwise("x0 != x1", self, o)  # type: ignore[override]

    def __pow__(self, exponent):
        if not isinstance(exponent, int | float):
            raise DtypeError(f"** takes a constant Python number as exponent, got {type(exponent).__name__}")
        return elementwise(f"x0 ** {float(exponent)!r}", self)

    def __matmul__(self, o):
        from einsummable.frontend.einsum import matmul

        return matmul(self, o)

    def __rmatmul__(self, o):
        from einsummable.frontend.einsum import matmul

        return matmul(o, self)

    def __getitem__(self, key) -> Tensor:  # steps and masks: frontend/tensor_extras.py
        return getitem(self, key)

    def __bool__(self):
        raise GraphError("a Tensor has no truth value until the graph runs; use where(...) in a join")

    def __len__(self) -> int:
        if not self.shape:
            raise ShapeError("len() of a 0-d Tensor")
        return self.shape[0]

    def __array_function__(self, func, types, args, kwargs):
        from einsummable.frontend.numpy_api import dispatch

        return dispatch(func, args, kwargs)

    # reductions
    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return reduce(self, axis, "add", keepdims=keepdims)

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        return reduce(self, axis, "max", keepdims=keepdims)

    def min(self, axis=None, keepdims: bool = False) -> Tensor:
        return reduce(self, axis, "min", keepdims=keepdims)

    def prod(self, axis=None, keepdims: bool = False) -> Tensor:
        return reduce(self, axis, "mul", keepdims=keepdims)

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        axes = _axes(axis, self.ndim)
        count = math.prod(self.shape[a] for a in axes)
        return reduce(self, axes, "add", join=f"x0 * {1.0 / max(count, 1)!r}", keepdims=keepdims)

    # shape
    def transpose(self, *axes) -> Tensor:
        if len(axes) == 1 and isinstance(axes[0], tuple | list):
            axes = tuple(axes[0])
        return transpose(self, axes or tuple(reversed(range(self.ndim))))

    @property
    def T(self) -> Tensor:
        return self.transpose()

    def reshape(self, *shape) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return reshape(self, shape)

    def astype(self, dtype: str) -> Tensor:
        return cast(self, dtype)

    def exp(self) -> Tensor:
        return elementwise("exp(x0)", self)

    def log(self) -> Tensor:
        return elementwise("log(x0)", self)

    def sqrt(self) -> Tensor:
        return elementwise("sqrt(x0)", self)

    def tanh(self) -> Tensor:
        return elementwise("tanh(x0)", self)


# ------------------------------------------------------------ primitive builders


def apply(op: Einsummable, tensors: Sequence[Tensor]) -> Tensor:
    """Append an einsummable, and its formation when it aggregates."""
    g = _common_graph(tensors)
    t = g._add(EinsumNode(op, tuple(t.id for t in tensors)))
    if op.agg is not None:
        t = g._add(Formation((t.id,), t.shape, t.dtype))
    return t


def _common_graph(tensors: Sequence[Tensor]) -> Graph:
    graphs = {id(t.graph): t.graph for t in tensors if isinstance(t, Tensor)}
    if len(graphs) != 1:
        raise GraphError("operands must be Tensors of one Graph" if graphs else "no Tensor operand given")
    return next(iter(graphs.values()))


def _axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {axis}")
    return tuple(sorted(out))


def elementwise(join: str | Expr, *args: Tensor | Scalar) -> Tensor:
    """Apply a join with numpy broadcasting.

    Python numbers become constants and strings become run-time variables, so
    ``w - "lr" * g`` reads the learning rate when the program runs.
    """
    expr = scalar.parse(join)
    target = common_float([a.dtype for a in args if isinstance(a, Tensor)])  # f16 * f32 is f32, as in numpy
    if target is not None:
        args = tuple(cast(a, target) if isinstance(a, Tensor) and a.dtype != target else a for a in args)
    tensors = [a for a in args if isinstance(a, Tensor)]
    if not tensors:
        raise GraphError("elementwise needs at least one Tensor operand")
    _common_graph(tensors)
    mapping: dict[int, Expr] = {}
    operands: list[Tensor] = []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            mapping[i] = Input(len(operands))
            operands.append(a)
        elif isinstance(a, int | float | complex) and not isinstance(a, bool):
            mapping[i] = Const(a)
        elif isinstance(a, str):
            mapping[i] = Var(check_variable_name(a, f"operand {i} of {scalar.to_string(expr)!r}"))
        else:
            raise DtypeError(f"operand {i} of {scalar.to_string(expr)!r} is a {type(a).__name__}")
    expr = scalar.fold_constants(substitute(expr, mapping))
    try:
        out_shape = _broadcast_shapes([t.shape for t in operands])
    except ShapeError as err:
        raise ShapeError(f"{scalar.to_string(expr)}: {err}") from None
    rank = len(out_shape)
    inputs, squeezed = [], []
    for t in operands:
        offset = rank - t.ndim
        keep = [d for d in range(t.ndim) if not (t.shape[d] == 1 and out_shape[offset + d] != 1)]
        if len(keep) != t.ndim:
            t = reshape(t, tuple(t.shape[d] for d in keep))
        inputs.append(tuple(offset + d for d in keep))
        squeezed.append(t)
    op = Einsummable(out_shape, tuple(inputs), rank, expr, None, tuple(t.dtype for t in squeezed))
    if op.is_elementwise() and expr == IDENTITY:
        return squeezed[0]
    return apply(op, squeezed)


def _broadcast_shapes(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        sizes = {s[len(s) - rank + d] for s in shapes if len(s) - rank + d >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast (axis {d})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def reduce(x: Tensor, axis, agg: str, join: str | Expr = "x0", keepdims: bool = False) -> Tensor:
    axes = _axes(axis, x.ndim)
    kept = [d for d in range(x.ndim) if d not in axes]
    if not axes:
        return elementwise(join, x)
    pos = {d: i for i, d in enumerate(kept + list(axes))}
    shape = tuple(x.shape[d] for d in kept + list(axes))
    op = Einsummable(shape, (tuple(pos[d] for d in range(x.ndim)),), len(kept), scalar.parse(join),
                     agg, (x.dtype,))
    out = apply(op, [x])
    if keepdims:
        out = reshape(out, tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)))
    return out


def transpose(x: Tensor, perm: Sequence[int]) -> Tensor:
    perm = tuple(p % x.ndim if x.ndim else p for p in perm)
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose axes {tuple(perm)} are not a permutation of range({x.ndim})")
    if perm == tuple(range(x.ndim)):
        return x
    # output axis k is input axis perm[k]; input axis d is output position perm.index(d)
    inputs = (tuple(perm.index(d) for d in range(x.ndim)),)
    op = Einsummable(tuple(x.shape[p] for p in perm), inputs, x.ndim, IDENTITY, None, (x.dtype,))
    return apply(op, [x])


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = to_shape(shape, wildcard=True)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape {shape}: at most one -1")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or x.size % rest:
            raise ShapeError(f"cannot reshape {x.shape} to {shape}")
        shape = tuple(x.size // rest if s == -1 else s for s in shape)
    if shape == x.shape:
        return x
    return x.graph._add(Reshape((x.id,), to_shape(shape), x.dtype))


def cast(x: Tensor, dtype: str) -> Tensor:
    dtype = canonical(dtype)
    if dtype == x.dtype:
        return x
    return elementwise(Cast(dtype, Input(0)), x)


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = to_shape(shape)
    if _broadcast_shapes([x.shape, shape]) != shape:
        raise ShapeError(f"cannot broadcast {x.shape} to {shape}")
    rank = len(shape)
    offset = rank - x.ndim
    keep = [d for d in range(x.ndim) if not (x.shape[d] == 1 and shape[offset + d] != 1)]
    t = reshape(x, tuple(x.shape[d] for d in keep))
    op = Einsummable(shape, (tuple(offset + d for d in keep),), rank, IDENTITY, None, (x.dtype,))
    return apply(op, [t])


def select(shape: Sequence[int], pieces: Sequence[tuple[Tensor, tuple, tuple]],
           pad: float = 0.0) -> Tensor:
    """Copy ``(tensor, src_box, dst_offset)`` pieces into a fresh tensor of ``shape``."""
    tensors = []
    ids: dict[int, int] = {}
    ir_pieces = []
    for t, src, dst in pieces:
        if t.id not in ids:
            ids[t.id] = len(tensors)
            tensors.append(t)
        ir_pieces.append(Piece(ids[t.id], tuple(src), tuple(dst)))
    g = _common_graph(tensors)
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise DtypeError(f"cannot combine dtypes {sorted(dtypes)} in one tensor; cast first")
    return g._add(Select(tuple(t.id for t in tensors), tuple(ir_pieces), to_shape(shape), dtypes.pop(), pad))


def getitem(x: Tensor, key) -> Tensor:
    """Basic numpy indexing: ints, slices with step 1, None and Ellipsis."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise ShapeError("an index can only have a single ellipsis")
    if n_real > x.ndim:
        raise ShapeError(f"too many indices ({n_real}) for a tensor of rank {x.ndim}")
    fill = [slice(None)] * (x.ndim - n_real)
    if Ellipsis in key:
        at = key.index(Ellipsis)
        expanded = [*key[:at], *fill, *key[at + 1 :]]
    else:
        expanded = [*key, *fill]
    box, out_shape, dim = [], [], 0
    for k in expanded:
        if k is None:
            out_shape.append(1)
            continue
        n = x.shape[dim]
        if isinstance(k, int) and not isinstance(k, bool):
            if not -n <= k < n:
                raise ShapeError(f"index {k} is out of bounds for axis {dim} with size {n}")
            k %= n
            box.append((k, k + 1))
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step != 1:
                raise ShapeError(f"slice step {k.step} on axis {dim}: only step 1 is supported")
            stop = max(start, stop)
            box.append((start, stop))
            out_shape.append(stop - start)
        else:
            raise ShapeError(f"unsupported index {k!r}; use ints, slices, None or ...")
        dim += 1
    if tuple(box) == whole(x.shape):
        sub = x
    else:
        sub = select([hi - lo for lo, hi in box], [(x, tuple(box), (0,) * x.ndim)])
    return reshape(sub, out_shape)


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    if not tensors:
        raise ShapeError("concat needs at least one tensor")
    first = tensors[0]
    axis = _axes(axis, first.ndim)[0]
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(
            a != b for d, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if d != axis
        ):
            raise ShapeError(f"concat along axis {axis}: shapes {first.shape} and {t.shape} disagree")
    if len(tensors) == 1:
        return first  # as a whole slice is the tensor itself: no copy
    pieces, offset = [], 0
    for t in tensors:
        dst = tuple(offset if d == axis else 0 for d in range(first.ndim))
        pieces.append((t, whole(t.shape), dst))
        offset += t.shape[axis]
    shape = tuple(offset if d == axis else n for d, n in enumerate(first.shape))
    return select(shape, pieces)


def pad(x: Tensor, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Tensor:
    if len(widths) != x.ndim:
        raise ShapeError(f"pad widths {widths} need one (before, after) pair per axis of {x.shape}")
    shape = tuple(n + a + b for n, (a, b) in zip(x.shape, widths, strict=True))
    return select(shape, [(x, whole(x.shape), tuple(a for a, _ in widths))], pad=value)


def view_as_complex(x: Tensor) -> Tensor:
    """``f32[..., 2n]`` as ``c64[..., n]``: pairs (re, im) along the last axis."""
    if x.dtype != "f32" or not x.shape or x.shape[-1] % 2:
        raise ShapeError(f"view_as_complex needs f32[..., 2n], got {x.dtype}{list(x.shape)}")
    return x.graph._add(ComplexView((x.id,), (*x.shape[:-1], x.shape[-1] // 2), "c64"))


def view_as_real(x: Tensor) -> Tensor:
    """``c64[..., n]`` as ``f32[..., 2n]``."""
    if x.dtype != "c64" or not x.shape:
        raise ShapeError(f"view_as_real needs c64[..., n], got {x.dtype}{list(x.shape)}")
    return x.graph._add(ComplexView((x.id,), (*x.shape[:-1], 2 * x.shape[-1]), "f32"))


def where(cond: Tensor, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    return elementwise("where(x0, x1, x2)", cond, a, b)
