"""Buffer donation: a kernel that writes into a block its run gives up, not into a fresh one.

A session run whose output replaces a resident input of the same name (a decode step's KV
cache, ``where(slot == t, new, cache)``) has no use for that input's blocks once they are
read. lower/fusion.py marks the apply that may write into such a block (``ApplyTask.donates``:
``where(c, x, old)`` over it, the block's one reader). Where the run's feed is given up
(``GivenUp``), the local engine runs that task in place: only the elements where ``c`` holds
are stored, into the given-up block, which becomes the output's. A cache update then costs
the slot it writes, not a read and a write of the whole cache.

Everything else runs as before: a run that donates nothing, and a block that is not the
engine's own whole array (a view of a feed or of another block), run the plain kernel into a
fresh block.

    prepared = prepare(tg, steps)              # at prepare: {task: (name, step)}
    steps = swap(steps, prepared, feeds)       # per run: those whose input is GivenUp
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from einsummable.engines.blocks import Blocks
from einsummable.engines.kernels.reference import align, alignment, compiled
from einsummable.ir.box import Box, intersect, whole
from einsummable.ir.dtypes import HALF, canonical, to_numpy
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Call, Cast, Const, Expr, Input, Var, inputs_used, substitute
from einsummable.ir.scalar import _variable
from einsummable.lower.fusion import match
from einsummable.lower.taskgraph import ApplyTask, TaskGraph

Step = Callable[[list, dict, dict], np.ndarray]
MAX_SLABS = 64  # more places where c holds than this: one masked store over the block instead


@dataclass(frozen=True)
class Donor:
    """A ``where(cond, value, x[slot])`` task that may store into the block of input ``name``
    it reads as operand ``slot``; ``value`` carries the join's final rounding, if any."""

    name: str
    slot: int
    cond: Expr
    value: Expr


def prepare(tg: TaskGraph, steps: Sequence[Step]) -> dict[int, tuple[str, Step]]:
    """``{task: (input name, in-place step)}`` for the applies marked ``donates``."""
    out: dict[int, tuple[str, Step]] = {}
    for j, task in enumerate(tg.tasks):
        if isinstance(task, ApplyTask) and task.donates >= 0:
            k, cond, value = match(task.op)
            name = tg.tasks[task.inputs[k]].name
            out[j] = (name, in_place(task.op, Donor(name, k, cond, value), steps[j]))
    return out


class GivenUp(Blocks):
    """A resident tensor's blocks, given up to the run that replaces them (``Session``): held
    nowhere else, so a kernel may write into them. As feeds they are read as any ``Blocks``,
    by the input tasks whose boxes ``reads`` counts; each stored block is let go after the last
    read that overlaps it, so it is freed after its last reader, as any other value is: a
    training step's old weights and moments are not held beside the new ones to the step's end
    (plan/predict/memory.py counts it so). Counting per tensor instead held every block until the
    tensor's last read: with 4 workers a momentum step held 14 MiB against 12 planned."""

    def __init__(self, blocks: Blocks, reads: Mapping[Box, int]) -> None:
        super().__init__(blocks.shape, blocks.dtype, dict(blocks.blocks))
        # the stored blocks each read box overlaps: itself alone where the read is a stored
        # block (the usual case: the program reads the layout it wrote), so this is linear
        self._overlaps = {box: self._overlapping(box) for box in reads}
        self._pending = dict.fromkeys(self.blocks, 0)
        for box, n in reads.items():
            for have in self._overlaps[box]:
                self._pending[have] += n
        self._all = sum(reads.values())
        self._reads = self._all
        self._lock = threading.Lock()

    def _overlapping(self, box: Box) -> tuple[Box, ...]:
        if box in self.blocks:
            return (box,)
        return tuple(have for have in self.blocks if intersect(box, have) is not None)

    @property
    def unread(self) -> bool:
        """No input task has read a block yet (a run that failed first left them as they were)."""
        return self._reads == self._all

    def get(self, box: Box) -> np.ndarray:
        # read outside the lock (a box laid out otherwise is assembled: a copy no other worker
        # need wait on), by key from the blocks it overlaps, which stay until it has counted
        overlaps = self._overlaps[box]  # every read is an input task's, counted in ``reads``
        out = Blocks(self.shape, self.dtype, {have: self.blocks[have] for have in overlaps}).get(box)
        with self._lock:
            self._reads -= 1
            for have in overlaps:
                self._pending[have] -= 1
                if self._pending[have] <= 0:
                    del self.blocks[have]
        return out


def given_up(state: Mapping[str, object], resident: Mapping[str, object], carry: frozenset[str],
             reads: Mapping[str, Mapping[Box, int]], unchanged: Mapping[str, frozenset[Box]]
             ) -> dict[str, GivenUp]:
    """The resident inputs of a local run that it replaces and whose blocks no other resident
    tensor shares (as the same array or a view of it): dead once read. Nothing outside holds
    them: ``Session.put`` copies in, ``state`` and fetches copy out. Not the blocks the run hands
    back as they lie (``unchanged``: an output that is its input's blocks, a decode step's
    weights), of which it frees nothing: giving up a decode step's 12 cost it ~60 us a run."""
    wanted = [name for name, value in resident.items() if name in carry
              and not (type(value) is Blocks and value.blocks.keys() == unchanged.get(name))]
    if not wanted:
        return {}
    owner: dict[int, str | None] = {}  # each array's memory by the one tensor holding it, None for several
    for name, value in state.items():
        for array in _arrays(value):
            root = _root(array)
            owner[root] = name if owner.get(root, name) == name else None
    return {name: GivenUp(_as_blocks(resident[name]), reads[name]) for name in wanted
            if all(owner[_root(a)] == name for a in _arrays(resident[name]))}


def _arrays(value: object) -> list[object]:
    return list(value.blocks.values()) if isinstance(value, Blocks) else [value]


def _as_blocks(value: object) -> Blocks:
    if isinstance(value, Blocks):
        return value
    array = np.asarray(value)
    return Blocks(array.shape, canonical(array.dtype), {whole(array.shape): array})


def _root(array: object) -> int:
    """The identity of the array that owns ``array``'s memory (``array`` itself unless a view)."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return id(array)


def swap(steps: list[Step], prepared: dict[int, tuple[str, Step]], feeds: Mapping[str, object]) -> list[Step]:
    """``steps`` with the in-place step of each task whose input is fed ``GivenUp``."""
    chosen = {j: step for j, (name, step) in prepared.items() if isinstance(feeds.get(name), GivenUp)}
    if not chosen:
        return steps
    steps = list(steps)
    for j, step in chosen.items():
        steps[j] = step
    return steps


def in_place(op: Einsummable, donor: Donor, plain: Step) -> Step:
    """The donor's step: store ``value`` where ``cond`` holds into the given-up block, or, for
    a block that is not the engine's own whole array, the ``plain`` step."""
    cond, value = _part(op, donor.cond), _part(op, donor.value)
    shape, dtype = op.out_shape, to_numpy(op.dtype)
    # the axes along which cond varies: those its operands index (a cache's slots)
    spans = tuple(sorted({i for k in inputs_used(donor.cond) for i in op.inputs[k] if op.join_shape[i] > 1}))

    def run(args, feeds, variables):
        block = args[donor.slot]
        if not _owned(block, shape, dtype):
            return plain(args, feeds, variables)
        _store(block, cond(args, variables), value(args, variables), spans)
        return block

    return run


_COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
            "ge": np.greater_equal}


def _part(op: Einsummable, e: Expr) -> Callable[[list, dict], np.ndarray]:
    """``e`` over the operands it reads, aligned to the join's axes (size 1 where they lack one):
    the result spans only the axes those operands index. An operand alone (the store casts it
    as the join's final cast would) and a comparison of operands, variables and constants run
    without the interpreter, whose call would cost more than a cache slot's store."""
    def leaf(a: Expr) -> Callable[[list, dict], object] | None:
        if isinstance(a, Input) and op.dtypes[a.index] not in HALF:  # (the interpreter widens a half)
            return _aligned(op, a.index)
        if isinstance(a, Var):
            return lambda args, variables: _variable(a.name, variables)
        if isinstance(a, Const):
            return lambda args, variables: a.value
        return None

    bare = e.arg if isinstance(e, Cast) and e.dtype == op.dtype else e
    if isinstance(bare, Input):
        return _aligned(op, bare.index)
    if isinstance(e, Call) and e.op in _COMPARE and None not in (sides := [leaf(a) for a in e.args]):
        compare, (x, y) = _COMPARE[e.op], sides
        return lambda args, variables: _full_rank(compare(x(args, variables), y(args, variables)), op.rank)
    used = sorted(inputs_used(e))
    fn = compiled(substitute(e, {k: Input(n) for n, k in enumerate(used)}), tuple(op.dtypes[k] for k in used))

    def run(args, variables):
        views = (align(args[k], op.inputs[k], op.join_shape) for k in used)
        return _full_rank(fn(*views, variables=variables), op.rank)

    return run


def _aligned(op: Einsummable, k: int) -> Callable[[list, dict], np.ndarray]:
    """Operand ``k`` viewed with its axes in join order, size 1 where it lacks one."""
    axes, shape = alignment(op.inputs[k], op.join_shape)
    if axes == sorted(axes):
        return lambda args, variables: args[k].reshape(shape)
    return lambda args, variables: args[k].transpose(axes).reshape(shape)


def _full_rank(a: object, rank: int) -> np.ndarray:
    a = np.asarray(a)
    return a if a.ndim == rank else a.reshape((1,) * (rank - a.ndim) + a.shape)


def _owned(block: object, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether ``block`` is a whole array of its own (not a view of a feed or of another block)."""
    return (isinstance(block, np.ndarray) and block.base is None and block.flags.c_contiguous
            and block.flags.writeable and block.shape == shape and block.dtype == dtype)


def _store(block: np.ndarray, cond: np.ndarray, value: np.ndarray, spans: tuple[int, ...]) -> None:
    """``block[cond] = value``, ``cond`` and ``value`` broadcast over it (``cond`` varying along
    ``spans`` alone): one slab per place ``cond`` holds, else, past MAX_SLABS, one masked store."""
    if len(spans) == 1:  # the places are indices along one axis: no coordinate tuples to build
        (a,) = spans
        hits = np.flatnonzero(cond)
        if len(hits) <= MAX_SLABS:
            lead, one = (slice(None),) * a, value.shape[a] == 1
            for h in hits.tolist():
                block[(*lead, h)] = value[(*lead, 0 if one else h)]
            return
    else:
        hits = np.argwhere(cond)
    if len(hits) > MAX_SLABS:
        np.copyto(block, np.broadcast_to(value, block.shape),
                  where=np.broadcast_to(cond, block.shape), casting="unsafe")
        return
    for hit in hits:
        at = tuple(int(h) if a in spans else slice(None) for a, h in enumerate(hit))
        of = tuple(slice(None) if a not in spans else int(h) if n > 1 else 0
                   for a, (h, n) in enumerate(zip(hit, value.shape, strict=True)))
        block[at] = value[of]
