"""The EinGraph: whole tensors, one node per op, ids in topological order.

Every node carries its shape and dtype, and a ``check`` that validates it against
its inputs, so an ill-formed node cannot enter a graph. An aggregating
einsummable is *partial* until a ``Formation`` materialises it; only formations
may consume it, which is where decomposed partial sums meet.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from einsummable.errors import DtypeError, GraphError, ShapeError
from einsummable.ir.box import Box, box_shape, fmt_box, intersect, place, shift, within
from einsummable.ir.dtypes import COMPLEX, DTYPES, INTS, NAMES, real_of
from einsummable.ir.einsummable import Einsummable, letter
from einsummable.ir.expr import variables_used

Shape = tuple[int, ...]


def _fmt_shape(dtype: str, shape: Shape) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


# ------------------------------------------------------------ fill kinds


@dataclass(frozen=True)
class Constant:
    value: float | complex

    def __str__(self) -> str:
        return f"constant({self.value})"


@dataclass(frozen=True)
class Tril:
    """Over the last two dims: ``inside`` where col - row <= offset, else ``outside``."""

    inside: float
    outside: float
    offset: int = 0

    def __str__(self) -> str:
        return f"tril(inside={self.inside}, outside={self.outside}, offset={self.offset})"


@dataclass(frozen=True)
class Ramp:
    """``start + sum_d steps[d] * index_d``: index ramps, position ids, diagonal masks."""

    start: float
    steps: tuple[float, ...]

    def __str__(self) -> str:
        return f"ramp(start={self.start}, steps={self.steps})"


FillKind = Constant | Tril | Ramp


@dataclass(frozen=True)
class Piece:
    """Copy ``inputs[input][src]`` into the output at offset ``dst``."""

    input: int
    src: Box
    dst: tuple[int, ...]

    @property
    def dst_box(self) -> Box:
        return place(box_shape(self.src), self.dst)


# ------------------------------------------------------------ node kinds


@dataclass(frozen=True)
class InputNode:
    name: str
    shape: Shape
    dtype: str
    inputs: tuple[int, ...] = ()
    # kept in host storage, loaded block by block before its readers, and the output of its
    # name stored as it is made (plan/offload.py chooses it when nothing else fits)
    stored: bool = False

    def check(self, g: EinGraph) -> None:
        _check_shape(self.shape, f"input {self.name!r}")
        _check_dtype(self.dtype, f"input {self.name!r}")

    def describe(self) -> str:
        return f"input {self.name!r}" + (" (stored)" if self.stored else "")


@dataclass(frozen=True)
class EinsumNode:
    op: Einsummable
    inputs: tuple[int, ...]
    shape: Shape = field(init=False)
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", self.op.out_shape)
        object.__setattr__(self, "dtype", self.op.dtype)

    def check(self, g: EinGraph) -> None:
        if len(self.inputs) != len(self.op.inputs):
            raise GraphError(f"einsum {self.op} has {len(self.op.inputs)} operands, given {len(self.inputs)}")
        for k, (nid, shape, dtype) in enumerate(
            zip(self.inputs, self.op.input_shapes, self.op.dtypes, strict=True)
        ):
            node = g.nodes[nid]
            if node.shape != shape:
                raise ShapeError(
                    f"einsum {self.op.spec} operand {k} (%{nid}) has shape {node.shape}, op expects {shape}"
                )
            if node.dtype != dtype:
                raise DtypeError(
                    f"einsum {self.op.spec} operand {k} (%{nid}) is {node.dtype}, op expects {dtype}"
                )

        empty = [i for i in self.op.aggregated if self.op.join_shape[i] == 0]
        if self.op.agg in ("min", "max") and empty:
            raise GraphError(
                f"einsum {self.op.spec} takes the {self.op.agg} over index {letter(empty[0])}, which has "
                f"size 0: an empty {self.op.agg} has no value (torch raises too); make the axis non-empty"
            )

    @property
    def partial(self) -> bool:
        return self.op.agg is not None

    def describe(self) -> str:
        return f"einsum[{self.op}]"


@dataclass(frozen=True)
class Formation:
    inputs: tuple[int]
    shape: Shape
    dtype: str

    def check(self, g: EinGraph) -> None:
        src = g.nodes[self.inputs[0]]
        if (src.shape, src.dtype) != (self.shape, self.dtype):
            raise GraphError(f"formation of %{self.inputs[0]} must keep its shape and dtype")

    def describe(self) -> str:
        return "formation"


@dataclass(frozen=True)
class Fill:
    kind: FillKind
    shape: Shape
    dtype: str
    inputs: tuple[int, ...] = ()

    def check(self, g: EinGraph) -> None:
        _check_shape(self.shape, "fill")
        _check_dtype(self.dtype, "fill")
        if isinstance(self.kind, Tril) and len(self.shape) < 2:
            raise ShapeError(f"a tril fill needs rank >= 2, got shape {self.shape}")
        if isinstance(self.kind, Ramp) and len(self.kind.steps) != len(self.shape):
            raise ShapeError(f"ramp steps {self.kind.steps} do not match fill shape {self.shape}")
        if self.dtype in INTS:
            kind = self.kind
            values = ((kind.value,) if isinstance(kind, Constant) else (kind.inside, kind.outside)
                      if isinstance(kind, Tril) else (kind.start, *kind.steps))
            _check_whole(values, self.dtype, f"fill[{kind}]")

    def describe(self) -> str:
        return f"fill[{self.kind}]"


@dataclass(frozen=True)
class Select:
    """Pieces of inputs copied into sub-boxes of the output; the rest is ``pad``."""

    inputs: tuple[int, ...]
    pieces: tuple[Piece, ...]
    shape: Shape
    dtype: str
    pad: float = 0.0

    def check(self, g: EinGraph) -> None:
        _check_shape(self.shape, "select")
        if self.dtype in INTS:
            _check_whole((self.pad,), self.dtype, "the padding of a select")
        for p in self.pieces:
            if not 0 <= p.input < len(self.inputs):
                raise GraphError(f"select piece names operand {p.input} of {len(self.inputs)}")
            src = g.nodes[self.inputs[p.input]]
            if src.dtype != self.dtype:
                raise DtypeError(f"select mixes {src.dtype} (%{self.inputs[p.input]}) into {self.dtype}")
            if len(p.src) != len(src.shape) or len(p.dst) != len(self.shape) != len(p.src):
                raise ShapeError(f"select piece {p} has the wrong rank for {src.shape} -> {self.shape}")
            for (lo, hi), n in zip(p.src, src.shape, strict=True):
                if not 0 <= lo <= hi <= n:
                    raise ShapeError(f"select source box {p.src} is outside operand shape {src.shape}")
            for (lo, hi), n in zip(p.dst_box, self.shape, strict=True):
                if not 0 <= lo <= hi <= n:
                    raise ShapeError(f"select target box {p.dst_box} is outside output shape {self.shape}")

    def reads(self, box: Box) -> list[tuple[int, tuple[int, Box], Box]]:
        """What the output block ``box`` reads, per piece that meets it:
        (piece number, (operand, source box), target box in the block's coordinates)."""
        out = []
        for n, p in enumerate(self.pieces):
            hit = intersect(p.dst_box, box)
            if hit is not None:
                src = shift(hit, [d - s for d, (s, _) in zip(p.dst, p.src, strict=True)])
                out.append((n, (p.input, src), within(hit, box)))
        return out

    def describe(self) -> str:
        parts = " ".join(
            f"{fmt_box(p.src)}@{p.input}->{list(p.dst)}" for p in self.pieces
        )
        return f"select[{parts}{'' if self.pad == 0 else f' pad={self.pad}'}]"


@dataclass(frozen=True)
class Reshape:
    """Merge or split adjacent dimensions (row-major), squeeze or unsqueeze."""

    inputs: tuple[int]
    shape: Shape
    dtype: str

    def check(self, g: EinGraph) -> None:
        _check_shape(self.shape, "reshape")
        src = g.nodes[self.inputs[0]]
        if math.prod(src.shape) != math.prod(self.shape):
            raise ShapeError(f"cannot reshape {src.shape} ({math.prod(src.shape)} elements) to {self.shape}")
        if src.dtype != self.dtype:
            raise DtypeError("reshape keeps the dtype")

    def describe(self) -> str:
        return "reshape"


@dataclass(frozen=True)
class ComplexView:
    """``f32[..., 2n]`` seen as ``c64[..., n]``, or back."""

    inputs: tuple[int]
    shape: Shape
    dtype: str

    def check(self, g: EinGraph) -> None:
        src = g.nodes[self.inputs[0]]
        to_complex = self.dtype in COMPLEX
        real, cplx = (src, self) if to_complex else (self, src)
        if cplx.dtype not in COMPLEX or real.dtype != real_of(cplx.dtype):
            raise DtypeError(f"a complex view maps f32 <-> c64, got {src.dtype} -> {self.dtype}")
        if not real.shape or real.shape[:-1] != cplx.shape[:-1] or real.shape[-1] != 2 * cplx.shape[-1]:
            raise ShapeError(f"a complex view maps [..., 2n] <-> [..., n], got {src.shape} -> {self.shape}")

    def describe(self) -> str:
        return "complex_view"


Node = InputNode | EinsumNode | Formation | Fill | Select | Reshape | ComplexView
NODE_KINDS = (InputNode, EinsumNode, Formation, Fill, Select, Reshape, ComplexView)


def to_shape(shape: Sequence[int], wildcard: bool = False) -> tuple[int, ...]:
    """Sizes are ints (numpy integers too, bools not): ``2.5`` or ``"4"`` is a mistake,
    never truncated or converted. ``wildcard`` admits reshape's one ``-1``."""
    if _is_int(shape):
        shape = (shape,)
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence | np.ndarray):
        raise ShapeError(f"shape {shape!r} must be a sequence of ints")
    for s in shape:
        if not _is_int(s):
            raise ShapeError(
                f"shape {tuple(shape)!r} has the size {s!r} ({type(s).__name__}); sizes must be ints"
            )
    out = tuple(operator.index(s) for s in shape)
    if any(s < 0 and not (wildcard and s == -1) for s in out):
        raise ShapeError(f"shape {out} has a negative size")
    return out


def _is_int(s: object) -> bool:
    return isinstance(s, int | np.integer) and not isinstance(s, bool)


def _check_shape(shape: Shape, what: str) -> None:
    if not isinstance(shape, tuple) or any(type(s) is not int or s < 0 for s in shape):
        raise ShapeError(f"{what} has shape {shape!r}; expected a tuple of non-negative ints")


def _check_whole(values: Sequence[float | complex], dtype: str, what: str) -> None:
    """An integer tensor's fill and pad values are whole numbers its dtype holds."""
    info = np.iinfo(NAMES[dtype])
    for v in values:
        if isinstance(v, complex) or not math.isfinite(v) or v != int(v) or not info.min <= v <= info.max:
            raise DtypeError(f"{what} is {dtype} but holds {v!r}, not a whole number in {dtype}'s range; "
                             "use a float dtype (such as f32) for it")


def _check_dtype(dtype: str, what: str) -> None:
    if dtype not in DTYPES:
        raise DtypeError(f"{what} has dtype {dtype!r}; expected one of {DTYPES}")


@dataclass(frozen=True)
class ClassIds:
    """Input ``input`` holds, within ``box``, class ids: integers in [0, classes); they are data,
    so this is checked when the input is fed (engines/feeds.py)."""

    input: str
    box: Box
    classes: int
    use: str  # what reads them, for the error message: "cross_entropy targets", "token ids"


# ------------------------------------------------------------ the graph


class EinGraph:
    """An append-only list of nodes plus named outputs."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.outputs: dict[str, int] = {}
        self.class_ids: list[ClassIds] = []
        # einsum node id -> the user's index letters in join-space order (out, then summed):
        # for display only, so ops and their equality never depend on them
        self.index_names: dict[int, str] = {}
        self._inputs: dict[str, int] = {}  # names added so far: a new input's is checked in O(1)

    def add(self, node: Node) -> int:
        self._check_node(len(self.nodes), node)
        self.nodes.append(node)
        if isinstance(node, InputNode):
            self._inputs[node.name] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def _check_node(self, nid: int, node: Node) -> None:
        if not isinstance(node, NODE_KINDS):
            raise GraphError(f"%{nid}: {type(node).__name__} is not a node kind")
        for i in node.inputs:
            if not 0 <= i < nid:
                raise GraphError(f"%{nid} ({node.describe()}) uses %{i}, which does not precede it")
            src = self.nodes[i]
            if isinstance(src, EinsumNode) and src.partial and not isinstance(node, Formation):
                raise GraphError(
                    f"%{nid} ({node.describe()}) reads %{i}, a partial aggregation; "
                    "insert a formation between them"
                )
        if isinstance(node, InputNode) and node.name in self._inputs:
            raise GraphError(f"two inputs are named {node.name!r}")
        node.check(self)

    def set_output(self, name: str, nid: int) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError(f"output name {name!r} must be a non-empty string")
        if not 0 <= nid < len(self.nodes):
            raise GraphError(f"output {name!r} names %{nid}, which is not in the graph")
        node = self.nodes[nid]
        if isinstance(node, EinsumNode) and node.partial:
            raise GraphError(f"output {name!r} is a partial aggregation (%{nid}); output its formation")
        if name in self.outputs and self.outputs[name] != nid:
            raise GraphError(f"output name {name!r} is already used")
        self.outputs[name] = nid

    def add_class_ids(self, ids: ClassIds) -> None:
        node = self.nodes[self.input_ids()[ids.input]]
        if len(ids.box) != len(node.shape) or any(not 0 <= lo < hi <= n for (lo, hi), n in
                                                  zip(ids.box, node.shape, strict=True)):
            raise GraphError(f"class-id box {ids.box} is outside input {ids.input!r} of shape {node.shape}")
        if ids not in self.class_ids:
            self.class_ids.append(ids)

    def validate(self) -> None:
        """Re-check every node; on failure say which node and show its neighbours."""
        replay = EinGraph()
        for nid, node in enumerate(self.nodes):
            try:
                replay.add(node)
            except Exception as err:
                lines = str(self).splitlines()
                context = "\n".join(lines[max(0, nid - 2) : nid + 4])
                raise GraphError(f"node %{nid} is invalid: {err}\n{context}") from err
        for name, nid in self.outputs.items():
            replay.set_output(name, nid)

    # ------------------------------------------------------------ queries

    def input_ids(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes) if isinstance(n, InputNode)}

    def users(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for nid, node in enumerate(self.nodes):
            for i in node.inputs:
                out[i].append(nid)
        return out

    def variables(self) -> set[str]:
        """Names of the run-time scalar variables that joins use."""
        names: set[str] = set()
        for node in self.nodes:
            if isinstance(node, EinsumNode):
                names |= variables_used(node.op.join)
        return names

    def live(self, roots: Iterable[int] | None = None) -> list[bool]:
        """Which nodes some output (or root) depends on."""
        keep = [False] * len(self.nodes)
        stack = list(self.outputs.values() if roots is None else roots)
        while stack:
            nid = stack.pop()
            if not keep[nid]:
                keep[nid] = True
                stack.extend(self.nodes[nid].inputs)
        return keep

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        inputs = [f"{n.name}: {_fmt_shape(n.dtype, n.shape)}" for n in self.nodes if isinstance(n, InputNode)]
        lines = [f"graph({', '.join(inputs)}) {{"]
        names = {i: n.name for i, n in enumerate(self.nodes) if isinstance(n, InputNode)}
        for nid, node in enumerate(self.nodes):
            if isinstance(node, InputNode):
                continue
            args = " ".join(names.get(i, f"%{i}") for i in node.inputs)
            partial = " partial" if isinstance(node, EinsumNode) and node.partial else ""
            lines.append(
                f"  %{nid} = {node.describe()} {args}".rstrip()
                + f"  : {_fmt_shape(node.dtype, node.shape)}{partial}"
            )
        outs = ", ".join(f"{k}={names.get(v, f'%{v}')}" for k, v in self.outputs.items())
        lines.append(f"  return {outs}")
        lines.append("}")
        return "\n".join(lines)

