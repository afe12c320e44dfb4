"""Graph, Tensor and the primitive builders that the Tensor's operators are written with.

A Graph hands out Tensors and a Tensor knows its Graph, so the two share this file; the
builders that no operator needs (concat, pad, where, ...) are in builders.py, and the
einsum language, written with these primitives, in einsum.py.

Every operation here appends EinGraph nodes; shapes and dtypes are checked as the
nodes are made, so a mistake surfaces at the line that wrote it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from einsummable.errors import DtypeError, GraphError, ShapeError, SpecError
from einsummable.frontend.numpy_api import dispatch
from einsummable.frontend.shapes import broadcast_shapes, index_box, kept_axes, normalize_axes
from einsummable.ir import scalar
from einsummable.ir.box import whole
from einsummable.ir.dot import render, to_dot
from einsummable.ir.dtypes import DEFAULT, FLOATS, INTS, canonical, common_float
from einsummable.ir.einsummable import IDENTITY, PRODUCT, Einsummable
from einsummable.ir.expr import Cast, Const, Expr, Input, Var, substitute
from einsummable.ir.graph import (
    Constant,
    EinGraph,
    EinsumNode,
    Fill,
    FillKind,
    Formation,
    InputNode,
    Node,
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
        """A graph input ``name`` of ``shape``: ``x = g.input("x", (4, 8))``; fed by ``run({"x": a})``."""
        return self.add(InputNode(name, to_shape(shape), canonical(dtype)))

    def output(self, name: str, t: Tensor) -> None:
        """Name ``t`` an output: ``g.output("y", x @ w)`` makes ``run(...)["y"]``."""
        self._own(t)
        self.ir.set_output(name, t.id)

    def fill(self, kind: FillKind, shape: Sequence[int], dtype: str = DEFAULT) -> Tensor:
        """A tensor of ``shape`` filled by ``kind`` (Constant, Tril or Ramp), computed on the workers."""
        return self.add(Fill(kind, to_shape(shape), canonical(dtype)))

    def full(self, shape: Sequence[int], value: Scalar, dtype: str = DEFAULT) -> Tensor:
        """A ``shape`` tensor of ``value`` everywhere, like ``np.full``."""
        return self.fill(Constant(value), shape, dtype)

    def zeros(self, shape: Sequence[int], dtype: str = DEFAULT) -> Tensor:
        """A ``shape`` tensor of zeros, like ``np.zeros``."""
        return self.full(shape, 0.0, dtype)

    def tril(self, shape: Sequence[int], inside: float = 1.0, outside: float = 0.0,
             offset: int = 0, dtype: str = DEFAULT) -> Tensor:
        """``inside`` on and below diagonal ``offset`` of the last two axes, ``outside`` above (masks)."""
        return self.fill(Tril(inside, outside, offset), shape, dtype)

    def ramp(self, shape: Sequence[int], steps: Sequence[float], start: float = 0.0,
             dtype: str = DEFAULT) -> Tensor:
        """``start + sum_d index[d] * steps[d]``: e.g. ``g.ramp((n,), (1.0,))`` is ``arange(n)``."""
        return self.fill(Ramp(start, tuple(float(s) for s in steps)), shape, dtype)

    def add(self, node: Node) -> Tensor:
        """Append an IR node (already checked by its constructor) and hand out its Tensor."""
        return Tensor(self, self.ir.add(node))

    def _own(self, t: Tensor) -> None:
        if not isinstance(t, Tensor):
            raise GraphError(f"expected a Tensor, got {type(t).__name__}")
        if t.graph is not self:
            raise GraphError("tensor belongs to a different Graph")

    @property
    def inputs(self) -> dict[str, Tensor]:
        """The graph's inputs by name."""
        return {name: Tensor(self, nid) for name, nid in self.ir.input_ids().items()}

    def __str__(self) -> str:
        return str(self.ir)

    def to_dot(self) -> str:
        """The graph as Graphviz DOT text."""
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
        """The IR node this tensor names."""
        return self.graph.ir.nodes[self.id]

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape, a tuple of ints."""
        return self.node.shape

    @property
    def dtype(self) -> str:
        """The element type: "f32", "f64", "c64" or another of ``ir.dtypes``."""
        return self.node.dtype

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
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
        return matmul(self, o)

    def __rmatmul__(self, o):
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
        return dispatch(func, args, kwargs)

    # reductions
    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        """Sum over ``axis`` (an int, a tuple, or None for all), like ``np.sum``."""
        return reduce(self, axis, "add", keepdims=keepdims)

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        """Max over ``axis`` (None: all axes), like ``np.max``."""
        return reduce(self, axis, "max", keepdims=keepdims)

    def min(self, axis=None, keepdims: bool = False) -> Tensor:
        """Min over ``axis`` (None: all axes), like ``np.min``."""
        return reduce(self, axis, "min", keepdims=keepdims)

    def prod(self, axis=None, keepdims: bool = False) -> Tensor:
        """Product over ``axis`` (None: all axes), like ``np.prod``."""
        return reduce(self, axis, "mul", keepdims=keepdims)

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        """Mean over ``axis`` (None: all axes), like ``np.mean``; of integers, an f32 (as jnp.mean)."""
        if self.dtype in INTS:
            return cast(self, DEFAULT).mean(axis, keepdims)
        axes = normalize_axes(axis, self.ndim)
        count = math.prod(self.shape[a] for a in axes)
        return reduce(self, axes, "add", join=f"x0 * {1.0 / max(count, 1)!r}", keepdims=keepdims)

    # shape
    def transpose(self, *axes) -> Tensor:
        """Axes permuted (default: reversed): ``x.transpose(1, 0)`` of ``[m, n]`` is ``[n, m]``."""
        if len(axes) == 1 and isinstance(axes[0], tuple | list):
            axes = tuple(axes[0])
        return transpose(self, axes or tuple(reversed(range(self.ndim))))

    @property
    def T(self) -> Tensor:
        """Axes reversed, like ``ndarray.T``."""
        return self.transpose()

    def reshape(self, *shape) -> Tensor:
        """The same elements in ``shape`` (one axis may be -1): ``x.reshape(2, -1)``."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return reshape(self, shape)

    def astype(self, dtype: str) -> Tensor:
        """Elements cast to ``dtype``: ``x.astype("f64")``."""
        return cast(self, dtype)

    def exp(self) -> Tensor:
        """Elementwise ``e**x``."""
        return elementwise("exp(x0)", self)

    def log(self) -> Tensor:
        """Elementwise natural log."""
        return elementwise("log(x0)", self)

    def sqrt(self) -> Tensor:
        """Elementwise square root."""
        return elementwise("sqrt(x0)", self)

    def tanh(self) -> Tensor:
        """Elementwise hyperbolic tangent."""
        return elementwise("tanh(x0)", self)


# ------------------------------------------------------------ primitive builders


def apply(op: Einsummable, tensors: Sequence[Tensor]) -> Tensor:
    """Append an einsummable, and its formation when it aggregates."""
    g = _common_graph(tensors)
    t = g.add(EinsumNode(op, tuple(t.id for t in tensors)))
    if op.agg is not None:
        t = g.add(Formation((t.id,), t.shape, t.dtype))
    return t


def _common_graph(tensors: Sequence[Tensor]) -> Graph:
    graphs = {id(t.graph): t.graph for t in tensors if isinstance(t, Tensor)}
    if len(graphs) != 1:
        raise GraphError("operands must be Tensors of one Graph" if graphs else "no Tensor operand given")
    return next(iter(graphs.values()))


def promote(args: Sequence[Tensor | Scalar]) -> tuple[Tensor | Scalar, ...]:
    """The float Tensors among ``args`` cast to their common type, as numpy's promotion does
    (f16 * f32 is f32, f32 * f64 is f64, bf16 * f16 is f32); the rest as given.

    The project's one rule: operations on Tensors (operators, ``matmul``, ``where``, an
    ``einsum`` without a join) promote; a join written in the scalar language does not,
    since it is the kernel's body and its operands' types are what it reads and writes.
    """
    target = common_float([a.dtype for a in args if isinstance(a, Tensor) and a.dtype in FLOATS])
    if target is None:
        return tuple(args)
    return tuple(cast(a, target) if isinstance(a, Tensor) and a.dtype in FLOATS and a.dtype != target
                 else a for a in args)


def elementwise(join: str | Expr, *args: Tensor | Scalar) -> Tensor:
    """Apply a join with numpy broadcasting.

    Python numbers become constants and strings become run-time variables, so
    ``w - "lr" * g`` reads the learning rate when the program runs.
    """
    expr = scalar.parse(join)
    args = promote(args)
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
        out_shape = broadcast_shapes([t.shape for t in operands])
    except ShapeError as err:
        raise ShapeError(f"{scalar.to_string(expr)}: {err}") from None
    rank = len(out_shape)
    inputs, squeezed = [], []
    for t in operands:
        keep = kept_axes(t.shape, out_shape)
        inputs.append(tuple(rank - t.ndim + d for d in keep))
        squeezed.append(reshape(t, tuple(t.shape[d] for d in keep)))
    op = Einsummable(out_shape, tuple(inputs), rank, expr, None, tuple(t.dtype for t in squeezed))
    if op.is_elementwise() and expr == IDENTITY:
        return squeezed[0]
    return apply(op, squeezed)


def reduce(x: Tensor, axis, agg: str, join: str | Expr = "x0", keepdims: bool = False) -> Tensor:
    """Aggregate ``join(x)`` with ``agg`` ("add", "mul", "max", "min") over ``axis``."""
    axes = normalize_axes(axis, x.ndim)
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
    """``x`` with output axis k taken from input axis ``perm[k]``, like ``np.transpose``."""
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
    """``x``'s elements in ``shape`` (one axis may be -1), like ``np.reshape``."""
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
    return x.graph.add(Reshape((x.id,), to_shape(shape), x.dtype))


def cast(x: Tensor, dtype: str) -> Tensor:
    """Elements of ``x`` cast to ``dtype`` ("f32", "f64", "c64", ...)."""
    dtype = canonical(dtype)
    if dtype == x.dtype:
        return x
    return elementwise(Cast(dtype, Input(0)), x)


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
    return g.add(Select(tuple(t.id for t in tensors), tuple(ir_pieces), to_shape(shape), dtypes.pop(), pad))


def getitem(x: Tensor, key) -> Tensor:
    """Basic numpy indexing: ints, slices with step 1, None and Ellipsis."""
    box, out_shape = index_box(x.shape, key)
    sub = x if box == whole(x.shape) else select([hi - lo for lo, hi in box], [(x, box, (0,) * x.ndim)])
    return reshape(sub, out_shape)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """numpy's ``matmul``: 1-D operands are promoted, batch dimensions broadcast.

    Written here rather than with ``einsum`` so that ``@`` needs nothing above this file.
    """
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise SpecError("matmul takes two Tensors")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul does not take scalars; use *")
    a, b = promote((a, b))
    a_mat, b_mat = a.ndim > 1, b.ndim > 1
    if a.shape[-1] != b.shape[-2 if b_mat else 0]:
        raise ShapeError(f"matmul: {a.shape} @ {b.shape}: inner sizes {a.shape[-1]} and "
                         f"{b.shape[-2 if b_mat else 0]} differ")
    batch = broadcast_shapes([a.shape[:-2] if a_mat else (), b.shape[:-2] if b_mat else ()])
    # join space: the batch axes, then i (rows of a), then k (columns of b), then j summed
    r = len(batch)
    i_ax, k_ax = r, r + int(a_mat)
    j_ax = k_ax + int(b_mat)
    a_sq, a_term = _batched(a, batch, (i_ax, j_ax) if a_mat else (j_ax,))
    b_sq, b_term = _batched(b, batch, (j_ax, k_ax) if b_mat else (j_ax,))
    rows, cols = (a.shape[-2],) if a_mat else (), (b.shape[-1],) if b_mat else ()
    shape = (*batch, *rows, *cols, a.shape[-1])
    op = Einsummable(shape, (a_term, b_term), j_ax, PRODUCT, "add", (a.dtype, b.dtype))
    t = apply(op, [a_sq, b_sq])
    node = t.id if isinstance(t.node, EinsumNode) else t.node.inputs[0]
    letters = "abcdefghlmnopqrstuvwxyz"[:r] + "i" * a_mat + "k" * b_mat + "j"
    t.graph.ir.index_names[node] = letters  # the plan report shows matmul's letters: ij,jk->ik
    return t


def _batched(t: Tensor, batch: tuple[int, ...], last: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
    """``t`` with the batch axes it broadcasts dropped, and its axes in matmul's join space."""
    lead = t.shape[: t.ndim - len(last)]
    keep = kept_axes(lead, batch)
    t = reshape(t, (*(lead[d] for d in keep), *t.shape[len(lead):]))
    return t, (*(len(batch) - len(lead) + d for d in keep), *last)
