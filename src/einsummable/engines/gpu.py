"""The GPU engine: a TaskGraph run with its blocks as torch tensors on one device.

Inputs: a validated TaskGraph, feeds (numpy arrays, or torch tensors already on the device)
and run-time variables. Output: ``{name: ndarray}`` (``run``) or ``{name: torch.Tensor}`` on
the device (``run_tensors``, so a training loop keeps its state there). The device is
``"cuda"`` where torch sees one, else torch's CPU device, where the same engine is tested.

Kernels (engines/kernels/triton.py, chosen once per block op): contractions as ``torch.einsum``
(cuBLAS), equality gathers as torch indexing, every other join as a Triton kernel generated
from its expression tree, or its tree evaluated with torch ops where Triton is off. Triton
runs on CUDA, and on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``); ``triton=``
forces it on or off. bf16 and f16 blocks stay half on the device, computed in f32.

Policy: one host thread issues the tasks in id order (the sequential loop,
``scheduler.run_in_order``, which frees each block after its last reader through torch's
caching allocator). On CUDA with several workers, worker w's tasks go to its own stream;
a task reading a block made on another stream waits on that task's event, and the block
is recorded on the reading stream so its memory is not reused early. On the CPU the tasks
simply run in order. A failing task raises ``EngineError`` naming it (``task.describe()``).

    prog = GpuProgram(es.compile(g, engine="simulate").taskgraph)
    prog.run({"x": X})                           # {"y": ndarray}
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping

import numpy as np
import torch

from einsummable.engines import scheduler
from einsummable.engines.kernels import triton as gpu_kernels
from einsummable.engines.kernels.triton import TORCH
from einsummable.errors import EngineError
from einsummable.ir.box import box_shape, slices, whole
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.graph import Constant, FillKind, Tril
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    FusedTask,
    InputTask,
    MoveTask,
    Output,
    PartialTask,
    TaskGraph,
    ViewTask,
)

SMALL_FILL = 1 << 16  # elements: a fill block up to this size is made once per program


def triton_mode(device: torch.device) -> str | None:
    """How Triton can run here: compiled on CUDA, interpreted on the CPU where
    ``TRITON_INTERPRET=1`` (read here, where a program is made), else not at all."""
    if importlib.util.find_spec("triton") is None:
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpret"
    return "cuda" if device.type == "cuda" else None


def to_device(a: object, device: torch.device) -> torch.Tensor:
    """A feed as a tensor on ``device``: a torch tensor there is used as it is (never written)."""
    if isinstance(a, torch.Tensor):
        return a.to(device)
    a = np.ascontiguousarray(a).reshape(np.shape(a))  # (ascontiguousarray makes a 0-d array 1-d)
    if a.dtype == to_numpy("bf16"):
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a if a.flags.writeable else a.copy())
    return t.to(device)


def to_host(t: torch.Tensor, dtype: str) -> np.ndarray:
    """A block or output as a fresh numpy array of ``dtype``."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(to_numpy("bf16")).copy()
    return t.numpy().astype(to_numpy(dtype), copy=True)


def fill(kind: FillKind, dtype: str, box, device: torch.device) -> torch.Tensor:
    """reference_kernel.fill made on the device (values in double, then cast once)."""
    shape, td = box_shape(box), TORCH[dtype]
    if isinstance(kind, Constant):
        return torch.full(shape, kind.value, dtype=td, device=device)
    f64 = {"dtype": torch.float64, "device": device}
    if isinstance(kind, Tril):
        (r0, r1), (c0, c1) = box[-2:]
        mask = (torch.arange(c0, c1, **f64)[None, :] - torch.arange(r0, r1, **f64)[:, None]) <= kind.offset
        plane = torch.where(mask, torch.tensor(kind.inside, **f64), torch.tensor(kind.outside, **f64))
        return plane.to(td).expand(shape).contiguous()
    out = torch.full(shape, kind.start, **f64)
    for d, ((lo, hi), step) in enumerate(zip(box, kind.steps, strict=True)):
        if step:
            view = [1] * len(shape)
            view[d] = hi - lo
            out = out + step * torch.arange(lo, hi, **f64).reshape(view)
    return out.to(td)


# ----------------------------------------------------------------- one step per task kind

def _input(task: InputTask, prog: GpuProgram):
    box = slices(task.box)
    return lambda args, feeds, variables: feeds[task.name][box]


def _constant(task: ConstantTask, prog: GpuProgram):
    if math.prod(task.shape) <= SMALL_FILL:
        block = fill(task.kind, task.dtype, task.box, prog.device)
        return lambda args, feeds, variables: block
    return lambda args, feeds, variables: fill(task.kind, task.dtype, task.box, prog.device)


def _apply(task: ApplyTask, prog: GpuProgram):
    kernel = gpu_kernels.prepare(task.op, prog.triton)
    return lambda args, feeds, variables: kernel(args, variables)


def _move(task: MoveTask, prog: GpuProgram):
    box = slices(task.box)
    return lambda args, feeds, variables: args[0][box]  # one device: a view is the move


REDUCE_INTO = {"add": torch.add, "mul": torch.mul, "min": torch.minimum, "max": torch.maximum}


def _partial(task: PartialTask, prog: GpuProgram):
    full, dtype = whole(task.shape), TORCH[task.dtype]
    pieces = [(p.input, slices(p.src), slices(p.dst_box), p.dst_box == full) for p in task.pieces]
    reduce = REDUCE_INTO[task.agg] if task.agg else None
    if pieces and all(w for *_, w in pieces):  # partial sums of whole blocks: accumulate in place
        (k0, src0, _, _), rest = pieces[0], pieces[1:]

        def accumulate(args, feeds, variables):
            if not rest:
                return args[k0][src0]
            out = args[k0][src0].to(dtype, copy=True)
            for k, src, _, _ in rest:
                reduce(out, args[k][src], out=out)
            return out

        return accumulate

    def assemble(args, feeds, variables):
        out = torch.full(task.shape, task.pad, dtype=dtype, device=prog.device)
        written = torch.zeros(task.shape, dtype=torch.bool, device=prog.device) if reduce else None
        for k, src, dst, _ in pieces:
            piece = args[k][src]
            if written is None:
                out[dst] = piece
            else:
                out[dst] = torch.where(written[dst], reduce(out[dst], piece), piece)
                written[dst] = True
        return out

    return assemble


def _view(task: ViewTask, prog: GpuProgram):
    dtype = TORCH[task.dtype]

    def run(args, feeds, variables):
        a = args[0]
        if a.dtype != dtype:
            a = a.contiguous().view(dtype)  # a complex view: pairs of reals, or their split
        return a.reshape(task.shape)

    return run


def _fused(task: FusedTask, prog: GpuProgram):
    """``first``'s kernel, then ``then``'s over its block (lower/fusion.py's pairs)."""
    first = gpu_kernels.prepare(task.first, prog.triton)
    then = gpu_kernels.prepare(task.then, prog.triton)

    def run(args, feeds, variables):
        return then(task.then_operands(args, first(task.first_operands(args), variables)), variables)

    return run


PREPARE = {
    InputTask: _input,
    ConstantTask: _constant,
    ApplyTask: _apply,
    FusedTask: _fused,
    MoveTask: _move,
    PartialTask: _partial,
    ViewTask: _view,
}


# ----------------------------------------------------------------- streams

class _Streams:
    """One CUDA stream per worker; events only where a block crosses streams."""

    def __init__(self, tg: TaskGraph, device: torch.device) -> None:
        self.streams = [torch.cuda.Stream(device=device) for _ in range(tg.workers)]
        self.lane = [task.loc % tg.workers for task in tg.tasks]
        self.crosses = [False] * len(tg.tasks)  # read on another stream: record an event
        for t, task in enumerate(tg.tasks):
            for i in task.inputs:
                if self.lane[i] != self.lane[t]:
                    self.crosses[i] = True
        self.events: dict[int, torch.cuda.Event] = {}

    def start(self) -> None:
        """Every worker stream waits for the feeds' uploads on the current stream."""
        for s in self.streams:
            s.wait_stream(torch.cuda.current_stream())
        self.events.clear()

    def run(self, i: int, inputs: tuple[int, ...], args: list, step):
        s = self.streams[self.lane[i]]
        for j, value in zip(inputs, args, strict=True):
            if self.lane[j] != self.lane[i]:
                s.wait_event(self.events[j])
                if isinstance(value, torch.Tensor):
                    value.record_stream(s)  # its memory stays out of reuse until s is done with it
        with torch.cuda.stream(s):
            value = step(args)
            if self.crosses[i]:
                self.events[i] = torch.cuda.Event()
                self.events[i].record(s)
        return value

    def finish(self) -> None:
        for s in self.streams:
            torch.cuda.current_stream().wait_stream(s)


# ----------------------------------------------------------------- the program

class GpuProgram:
    """A TaskGraph made ready to run on one torch device: kernels chosen once."""

    def __init__(self, tg: TaskGraph, device: str | None = None, *, triton: bool | None = None) -> None:
        self.tg = tg
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        mode = triton_mode(self.device)
        if triton and mode is None:
            raise EngineError("triton=True, but Triton is not installed or cannot run here (on the CPU "
                              "it needs TRITON_INTERPRET=1): pip install triton")
        self.triton = mode if triton is None or triton else None  # None: torch ops only
        self.keep = {t for out in tg.outputs.values() for t, _ in out.blocks}
        self.feeds = sorted({t.name for t in tg.tasks if isinstance(t, InputTask)})
        self.steps = []
        for t, task in enumerate(tg.tasks):
            prepare = PREPARE.get(type(task))
            if prepare is None:
                raise EngineError(f"task {t} ({task.describe()}): the GPU engine has no step for "
                                  f"{type(task).__name__}")
            try:
                self.steps.append(prepare(task, self))
            except Exception as err:
                raise EngineError(f"task {t} ({task.describe()}) could not be prepared: "
                                  f"{type(err).__name__}: {err}") from err
        cuda = self.device.type == "cuda"
        self.streams = _Streams(tg, self.device) if cuda and tg.workers > 1 else None

    def run_tensors(self, feeds: Mapping[str, object], variables: dict[str, float] | None = None
                    ) -> dict[str, torch.Tensor]:
        """Run and return the outputs as tensors on the device (an output may share memory
        with a feed given as a tensor)."""
        variables = dict(variables or {})
        missing = [n for n in self.feeds if n not in feeds]
        if missing:
            raise EngineError(f"the GPU engine was not fed {missing}")
        tasks, steps, streams = self.tg.tasks, self.steps, self.streams
        with torch.inference_mode():
            on_device = {n: to_device(feeds[n], self.device) for n in self.feeds}
            if streams is None:
                def execute(i, args):
                    return steps[i](args, on_device, variables)
            else:
                streams.start()

                def execute(i, args):
                    return streams.run(i, tasks[i].inputs, args, lambda a: steps[i](a, on_device, variables))
            values = scheduler.run_in_order([t.inputs for t in tasks], execute, self.keep,
                                            describe=lambda i: tasks[i].describe())
            if streams is not None:
                streams.finish()
            return {name: self._assemble(out, values) for name, out in self.tg.outputs.items()}

    def _assemble(self, out: Output, values: dict[int, torch.Tensor]) -> torch.Tensor:
        if len(out.blocks) == 1:
            return values[out.blocks[0][0]].to(TORCH[out.dtype]).contiguous()
        array = torch.empty(out.shape, dtype=TORCH[out.dtype], device=self.device)
        for t, box in out.blocks:
            array[slices(box)] = values[t]
        return array

    def run(self, feeds: Mapping[str, object], variables: dict[str, float] | None = None,
            carry: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
        """Run on numpy feeds and return numpy outputs, like ``local.LocalProgram.run``
        (``carry`` is accepted for the engines' common signature; outputs come back whole)."""
        outputs = self.run_tensors(feeds, variables)
        try:
            return {name: to_host(t, self.tg.outputs[name].dtype) for name, t in outputs.items()}
        except RuntimeError as err:  # an asynchronous CUDA failure surfaces at the copy back
            raise EngineError(f"the GPU run failed: {err}") from err


def run(tg: TaskGraph, feeds: Mapping[str, object], variables: dict[str, float] | None = None,
        device: str | None = None) -> dict[str, np.ndarray]:
    """Prepare and run once."""
    return GpuProgram(tg, device).run(feeds, variables)
