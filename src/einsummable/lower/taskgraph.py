"""The TaskGraph: IR 2, block kernels with a location each.

Tasks are plain frozen records in topological order; a task names its inputs by
position in ``TaskGraph.tasks`` and runs at ``loc`` (a worker). Every input of a
task other than a move lives at the task's own location, so an engine never
copies data except in a move. Kinds:
- ``input``: a block (``box``) of a graph input;
- ``constant``: a block of a fill, in the fill's coordinates;
- ``apply``: an einsummable over blocks (``op`` is already the block's op);
- ``move``: a sub-box of a block, copied from ``src`` to ``loc``;
- ``partial``: a fresh block built from pieces written into sub-regions; where
  pieces overlap they are combined with ``agg`` (the first write assigns), where
  none writes the block holds ``pad``. Formation and repartition are partials;
- ``view``: a block reinterpreted row-major (reshape, complex view);
- ``fused``: two applies in one task (lower/fusion.py): ``first``'s block is an operand of
  ``then``, read by nothing else (a GEMM and its epilogue, a row reduction and its join).

An apply's ``donates`` names the operand whose block it may write in place, where a session
run gives that block up (a KV cache's slot update; lower/fusion.py marks it, the local engine
does it, and any engine may ignore it).

A move's data is its first input, a partial's the inputs its pieces name; any other input
is a *gate*, waited for and not read (lower/prefetch.py: it holds a copy back until its
machine's work is near the copy's reader), anywhere on the task's machine.

Example: ``%3 @1 = move[0:2,0:4] %0@0 : f32[2,4]`` copies rows 0..2 of task 0 from
worker 0 to worker 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from einsummable.errors import PlanError
from einsummable.ir import priority
from einsummable.ir.box import Box, box_shape, fmt_box, volume
from einsummable.ir.dtypes import COMPLEX, real_of
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.graph import FillKind, Piece

Shape = tuple[int, ...]


class _Boxed:
    """A task whose block is the ``box`` it names: its shape is the box's."""

    box: Box

    @property
    def shape(self) -> Shape:
        return box_shape(self.box)


@dataclass(frozen=True)
class InputTask(_Boxed):
    name: str
    box: Box
    dtype: str
    loc: int
    inputs: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"input {self.name!r}{fmt_box(self.box)}"


@dataclass(frozen=True)
class ConstantTask(_Boxed):
    kind: FillKind
    box: Box
    dtype: str
    loc: int
    inputs: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"constant[{self.kind}]{fmt_box(self.box)}"


@dataclass(frozen=True)
class ApplyTask:
    op: Einsummable
    inputs: tuple[int, ...]
    loc: int
    node: int = -1  # the EinGraph node this block belongs to, for error messages
    donates: int = -1  # the operand it may write in place when its block is given up (-1: none)
    shape: Shape = field(init=False)
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", self.op.out_shape)
        object.__setattr__(self, "dtype", self.op.dtype)

    def describe(self) -> str:
        donates = f" donates {self.donates}" if self.donates >= 0 else ""
        return f"apply[{self.op}]{donates}" + (f" of node %{self.node}" if self.node >= 0 else "")


@dataclass(frozen=True)
class FusedTask:
    """``then`` over ``first``'s block, in one task. ``slots``: for each operand of ``first``,
    then of ``then``, its position in ``inputs``; -1 is ``first``'s block (``then``'s operand
    ``k``). An input both read comes once. Every engine hands the two ops their operands with
    ``first_operands`` and ``then_operands``."""

    first: Einsummable
    then: Einsummable
    slots: tuple[int, ...]
    inputs: tuple[int, ...]
    loc: int
    node: int = -1
    shape: Shape = field(init=False)
    dtype: str = field(init=False)
    first_slots: tuple[int, ...] = field(init=False, repr=False)
    then_slots: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.first.inputs)
        for name, value in (("shape", self.then.out_shape), ("dtype", self.then.dtype),
                            ("first_slots", self.slots[:n]), ("then_slots", self.slots[n:])):
            object.__setattr__(self, name, value)

    @property
    def k(self) -> int:
        """The operand of ``then`` that is ``first``'s block."""
        return self.then_slots.index(-1)

    def first_operands(self, args: Sequence) -> list:
        """``first``'s operands, of the task's arguments (its inputs' blocks, in order)."""
        return [args[s] for s in self.first_slots]

    def then_operands(self, args: Sequence, block: object) -> list:
        """``then``'s operands: the task's arguments, ``first``'s ``block`` at its place."""
        return [block if s < 0 else args[s] for s in self.then_slots]

    def describe(self) -> str:
        return f"fused[{self.first}; {self.then} reads it as x{self.k}]" + \
            (f" of node %{self.node}" if self.node >= 0 else "")


@dataclass(frozen=True)
class MoveTask(_Boxed):
    inputs: tuple[int]
    box: Box
    src: int
    loc: int
    dtype: str

    def describe(self) -> str:
        return f"move{fmt_box(self.box)} from {self.src}"


@dataclass(frozen=True)
class PartialTask:
    inputs: tuple[int, ...]
    pieces: tuple[Piece, ...]
    shape: Shape
    dtype: str
    agg: str | None
    loc: int
    pad: float = 0.0

    def describe(self) -> str:
        parts = " ".join(f"{fmt_box(p.src)}@{p.input}->{list(p.dst)}" for p in self.pieces)
        agg = f" agg={self.agg}" if self.agg else ""
        pad = f" pad={self.pad}" if self.pad else ""
        return f"partial[{parts}{agg}{pad}]"


@dataclass(frozen=True)
class ViewTask:
    inputs: tuple[int]
    shape: Shape
    dtype: str
    loc: int

    def describe(self) -> str:
        return "view"


Task = InputTask | ConstantTask | ApplyTask | MoveTask | PartialTask | ViewTask | FusedTask
TASK_KINDS = (InputTask, ConstantTask, ApplyTask, MoveTask, PartialTask, ViewTask, FusedTask)


@dataclass(frozen=True)
class Output:
    """A graph output assembled from blocks: (task, box in the output)."""

    shape: Shape
    dtype: str
    blocks: tuple[tuple[int, Box], ...]


@dataclass(frozen=True, eq=False)
class TaskGraph:
    tasks: tuple[Task, ...]
    outputs: dict[str, Output]
    workers: int
    cores: int
    order: str = priority.CRITICAL_PATH  # which ready task runs first, on every engine (ir/priority.py)
    # inputs kept in host storage: their input tasks load a copy, and the blocks of the output
    # of the same name are stored as they are made (plan/offload.py)
    stored: frozenset[str] = frozenset()

    def stored_as_made(self) -> set[int]:
        """The tasks whose block goes to host storage as it is made (a stored input's new value)."""
        return {t for name in self.stored & set(self.outputs) for t, _ in self.outputs[name].blocks}

    def machine_of(self, loc: int) -> int:
        return loc // self.cores

    def readers(self) -> list[int]:
        """How many tasks, and output blocks, read each task: when the count falls to
        zero its block can be freed."""
        count = [0] * len(self.tasks)
        for task in self.tasks:
            for i in task.inputs:
                count[i] += 1
        for out in self.outputs.values():
            for t, _ in out.blocks:
                count[t] += 1
        return count

    def users(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.tasks]
        for t, task in enumerate(self.tasks):
            for i in task.inputs:
                out[i].append(t)
        return out

    def validate(self) -> None:
        """Check every task against its inputs; on failure show the tasks around it."""
        for t, task in enumerate(self.tasks):
            try:
                _check(self, t, task)
            except PlanError as err:
                lines = str(self).splitlines()
                context = "\n".join(lines[max(0, t - 2) : t + 4])
                raise PlanError(f"task %{t} is invalid: {err}\n{context}") from err
        for name, out in self.outputs.items():
            covered = 0
            for t, box in out.blocks:
                if not 0 <= t < len(self.tasks) or self.tasks[t].shape != box_shape(box):
                    raise PlanError(f"output {name!r}: block {fmt_box(box)} does not match task %{t}")
                covered += volume(box)
            if covered != math.prod(out.shape):
                raise PlanError(f"output {name!r}: blocks cover {covered} of {math.prod(out.shape)} elements")

    def __len__(self) -> int:
        return len(self.tasks)

    def __str__(self) -> str:
        order = "" if self.order == priority.CRITICAL_PATH else f", {self.order} order"
        stored = f", stored {', '.join(sorted(self.stored))}" if self.stored else ""
        lines = [f"taskgraph({self.workers} workers{order}{stored}) {{"]
        for t, task in enumerate(self.tasks):
            args = " ".join(f"%{i}" for i in task.inputs)
            shape = f"{task.dtype}[{','.join(map(str, task.shape))}]"
            lines.append(f"  %{t} @{task.loc} = {task.describe()} {args}".rstrip() + f" : {shape}")
        for name, out in self.outputs.items():
            blocks = " ".join(f"%{t}{fmt_box(box)}" for t, box in out.blocks)
            lines.append(f"  return {name} = {blocks}")
        lines.append("}")
        return "\n".join(lines)


def data_inputs(task: Task) -> tuple[int, ...]:
    """The inputs whose blocks a task reads; the rest are gates (the module docstring)."""
    if isinstance(task, MoveTask):
        return task.inputs[:1]
    if isinstance(task, PartialTask):
        return task.inputs[:max((p.input for p in task.pieces), default=-1) + 1]
    if isinstance(task, InputTask):  # a load from host storage may wait for a gate
        return ()
    return task.inputs


def _check(tg: TaskGraph, t: int, task: Task) -> None:
    if not isinstance(task, TASK_KINDS):
        raise PlanError(f"{type(task).__name__} is not a task kind")
    if not 0 <= task.loc < tg.workers:
        raise PlanError(f"location {task.loc} outside 0..{tg.workers - 1}")
    where = task.src if isinstance(task, MoveTask) else task.loc
    data = data_inputs(task)
    for k, i in enumerate(task.inputs):
        if not 0 <= i < t:
            raise PlanError(f"uses %{i}, which does not precede it")
        if k < len(data) and tg.tasks[i].loc != where:
            raise PlanError(f"reads %{i} at {tg.tasks[i].loc} but runs at {where}")
        if k >= len(data) and tg.machine_of(tg.tasks[i].loc) != tg.machine_of(where):
            raise PlanError(f"gate %{i} is on machine {tg.machine_of(tg.tasks[i].loc)}, the task's is "
                            f"{tg.machine_of(where)}")
    ins = [tg.tasks[i] for i in data]
    if isinstance(task, ApplyTask):
        _check_operands(task.op, ins, "")
    elif isinstance(task, FusedTask):
        _check_operands(task.first, task.first_operands(ins), "first's ")
        _check_operands(task.then, task.then_operands(ins, task.first), "then's ")
    elif isinstance(task, MoveTask):
        _check_box(task.box, ins[0].shape, "move box")
        if ins[0].dtype != task.dtype:
            raise PlanError("a move keeps the dtype")
    elif isinstance(task, PartialTask):
        for p in task.pieces:
            src = ins[p.input]
            _check_box(p.src, src.shape, "piece source")
            _check_box(p.dst_box, task.shape, "piece target")
            if src.dtype != task.dtype:
                raise PlanError(f"piece of {src.dtype} in a {task.dtype} partial")
    elif isinstance(task, ViewTask):
        src = ins[0]
        if src.dtype == task.dtype:
            if math.prod(src.shape) != math.prod(task.shape):
                raise PlanError(f"cannot view {src.shape} as {task.shape}")
        else:
            cplx, real = (task, src) if task.dtype in COMPLEX else (src, task)
            if real_of(cplx.dtype) != real.dtype or real.shape[:-1] != cplx.shape[:-1] or (
                real.shape[-1] != 2 * cplx.shape[-1]
            ):
                raise PlanError(f"bad complex view {src.dtype}{list(src.shape)} -> {task.dtype}")


def _check_operands(op: Einsummable, ins: list, what: str) -> None:
    for k, (src, shape, dtype) in enumerate(zip(ins, op.input_shapes, op.dtypes, strict=True)):
        have = (src.out_shape, src.dtype) if isinstance(src, Einsummable) else (src.shape, src.dtype)
        if have != (shape, dtype):
            raise PlanError(f"{what}operand {k} is {have[1]}{list(have[0])}, op wants {dtype}{list(shape)}")


def _check_box(box: Box, shape: Shape, what: str) -> None:
    if len(box) != len(shape) or any(not 0 <= lo <= hi <= n for (lo, hi), n in zip(box, shape, strict=True)):
        raise PlanError(f"{what} {fmt_box(box)} is outside shape {shape}")
