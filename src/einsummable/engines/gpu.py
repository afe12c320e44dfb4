"""The GPU engine: a TaskGraph run with its blocks as torch tensors on CUDA devices.

Inputs: a validated TaskGraph, feeds (numpy arrays, or torch tensors already on a device)
and run-time variables. Output: ``{name: ndarray}`` (``run``) or ``{name: torch.Tensor}`` on
the first device (``run_tensors``, so a training loop keeps its state there).

Devices: a cluster's machines are GPUs (``Cluster.gpus``): machine m is ``cuda:m`` and its
cores share it, one stream each (``machine_devices``; worker w is on machine
``w // (workers // machines)``, as the planner numbers them). Without CUDA every machine is
torch's CPU device, where the same engine is tested. An input block is sliced where its feed
is and copied to its worker's device; a move between devices is a device-to-device copy, one
on a device a view.

Kernels (engines/kernels/triton.py, chosen once per block op): contractions as ``torch.einsum``
(cuBLAS), equality gathers as torch indexing, every other join as a Triton kernel generated
from its expression tree, or its tree evaluated with torch ops where Triton is off. Triton
runs on CUDA, and on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``); ``triton=``
forces it on or off. bf16 and f16 blocks stay half on the device, computed in f32.

Policy: one host thread issues the tasks in id order (the sequential loop,
``scheduler.run_in_order``, which frees each block after its last reader through torch's
caching allocator). On CUDA with several workers, worker w's tasks go to its own stream on
its device; a task reading a block made on another stream waits on that task's event, and
the block is recorded on the reading stream so its memory is not reused early. A copy from
another device runs on that device's current stream (torch's rule), so that stream waits
for the block's event too. On the CPU the tasks simply run in order. A failing task raises
``EngineError`` naming it (``task.describe()``).

    prog = es.compile(g, engine="gpu")           # Cluster.gpus(): every visible GPU
    prog.run({"x": X})                           # {"y": ndarray}
    GpuProgram(taskgraph, "cuda:0")              # a TaskGraph's workers as streams on one GPU
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
from collections.abc import Mapping, Sequence

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


def machine_devices(machines: int) -> list[torch.device]:
    """The device of each of a cluster's machines: ``cuda:m`` for machine m where torch sees
    CUDA (EngineError if there are fewer GPUs than machines), else torch's CPU device for all."""
    if not torch.cuda.is_available():
        return [torch.device("cpu")] * machines
    count = torch.cuda.device_count()
    if machines > count:
        raise EngineError(f"the plan is for {machines} GPUs (machines), but torch sees {count}: "
                          f"plan for es.Cluster.gpus({count}) or fewer")
    return [torch.device("cuda", m) for m in range(machines)]


def worker_devices(workers: int, devices: Sequence[torch.device]) -> list[torch.device]:
    """Each worker's device: the machines' devices in turn, ``workers // len(devices)`` each."""
    if workers % len(devices):
        raise EngineError(f"{workers} workers do not split evenly over {len(devices)} devices")
    per = workers // len(devices)
    return [devices[w // per] for w in range(workers)]


def as_tensor(a: object) -> torch.Tensor:
    """A feed as a tensor where it is: a torch tensor as it is (never written), a numpy array
    as a host tensor sharing its memory (blocks are sliced from it, then copied to a device)."""
    if isinstance(a, torch.Tensor):
        return a
    a = np.ascontiguousarray(a).reshape(np.shape(a))  # (ascontiguousarray makes a 0-d array 1-d)
    if a.dtype == to_numpy("bf16"):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def to_device(a: object, device: torch.device) -> torch.Tensor:
    """A feed as a tensor on ``device`` (a training loop's state, uploaded once)."""
    return as_tensor(a).to(device)


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
    box, device = slices(task.box), prog.devices[task.loc]
    return lambda args, feeds, variables: feeds[task.name][box].to(device)


def _constant(task: ConstantTask, prog: GpuProgram):
    device = prog.devices[task.loc]
    if math.prod(task.shape) <= SMALL_FILL:
        block = fill(task.kind, task.dtype, task.box, device)
        return lambda args, feeds, variables: block
    return lambda args, feeds, variables: fill(task.kind, task.dtype, task.box, device)


def _apply(task: ApplyTask, prog: GpuProgram):
    kernel = gpu_kernels.prepare(task.op, prog.triton)
    return lambda args, feeds, variables: kernel(args, variables)


def _move(task: MoveTask, prog: GpuProgram):
    box, device = slices(task.box), prog.devices[task.loc]
    if prog.devices[task.src] == device:
        return lambda args, feeds, variables: args[0][box]  # on one device a view is the move
    return lambda args, feeds, variables: args[0][box].to(device)


REDUCE_INTO = {"add": torch.add, "mul": torch.mul, "min": torch.minimum, "max": torch.maximum}


def _partial(task: PartialTask, prog: GpuProgram):
    full, dtype, device = whole(task.shape), TORCH[task.dtype], prog.devices[task.loc]
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
        out = torch.full(task.shape, task.pad, dtype=dtype, device=device)
        written = torch.zeros(task.shape, dtype=torch.bool, device=device) if reduce else None
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
    """One CUDA stream per worker, on its device; events only where a block crosses streams."""

    def __init__(self, tg: TaskGraph, devices: Sequence[torch.device]) -> None:
        self.streams = [torch.cuda.Stream(device=d) for d in devices]
        self.lane = [task.loc % tg.workers for task in tg.tasks]
        self.crosses = [False] * len(tg.tasks)  # read on another stream: record an event
        for t, task in enumerate(tg.tasks):
            for i in task.inputs:
                if self.lane[i] != self.lane[t]:
                    self.crosses[i] = True
        self.events: dict[int, torch.cuda.Event] = {}

    def start(self) -> None:
        """Every worker stream waits for what its device's current stream has queued (feeds)."""
        for s in self.streams:
            s.wait_stream(torch.cuda.current_stream(s.device))
        self.events.clear()

    def run(self, i: int, inputs: tuple[int, ...], args: list, step):
        s = self.streams[self.lane[i]]
        for j, value in zip(inputs, args, strict=True):
            if self.lane[j] != self.lane[i]:
                s.wait_event(self.events[j])
                if not isinstance(value, torch.Tensor):
                    continue
                if value.device == s.device:
                    value.record_stream(s)  # its memory stays out of reuse until s is done with it
                else:  # a move from another device: torch copies on that device's current stream
                    there = torch.cuda.current_stream(value.device)
                    there.wait_event(self.events[j])
                    value.record_stream(there)
        with torch.cuda.stream(s):
            value = step(args)
            if self.crosses[i]:
                self.events[i] = torch.cuda.Event()
                self.events[i].record(s)
        return value

    def finish(self) -> None:
        """Each device's current stream (outputs are gathered there) waits for every worker stream."""
        for d in {s.device for s in self.streams}:
            for s in self.streams:
                torch.cuda.current_stream(d).wait_stream(s)


# ----------------------------------------------------------------- the program

class GpuProgram:
    """A TaskGraph made ready to run on torch devices: kernels chosen once.

    ``device``: one device for every worker (``"cuda:0"``, ``"cpu"``), or one per machine
    (``machine_devices``); None is ``machine_devices(machines)``, the GPUs of a plan for
    ``machines`` of them."""

    def __init__(self, tg: TaskGraph, device: str | Sequence[str | torch.device] | None = None, *,
                 triton: bool | None = None, machines: int = 1) -> None:
        self.tg = tg
        if device is None:
            machine = machine_devices(machines)
        elif isinstance(device, (str, torch.device)):
            machine = [torch.device(device)]
        else:
            machine = [torch.device(d) for d in device]
        self.devices = worker_devices(tg.workers, machine)
        self.device = self.devices[0]  # where outputs are gathered
        if len({d.type for d in self.devices}) > 1:
            raise EngineError(f"devices {sorted(map(str, set(self.devices)))} mix kinds; the GPU engine "
                              "runs on CUDA devices, or all on the CPU")
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
        self.streams = _Streams(tg, self.devices) if cuda and tg.workers > 1 else None

    def run_tensors(self, feeds: Mapping[str, object], variables: dict[str, float] | None = None
                    ) -> dict[str, torch.Tensor]:
        """Run and return the outputs as tensors on the device (an output may share memory
        with a feed given as a tensor)."""
        variables = dict(variables or {})
        missing = [n for n in self.feeds if n not in feeds]
        if missing:
            raise EngineError(f"the GPU engine was not fed {missing}")
        tasks, steps, streams = self.tg.tasks, self.steps, self.streams
        on_gpu = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
        with torch.inference_mode(), on_gpu:  # (Triton launches on the current device)
            on_device = {n: as_tensor(feeds[n]) for n in self.feeds}
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
            return values[out.blocks[0][0]].to(self.device, TORCH[out.dtype]).contiguous()
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
        device: str | Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Prepare and run once."""
    return GpuProgram(tg, device).run(feeds, variables)
