"""The GPU engine's block kernels: one einsummable over torch tensors (engines/gpu.py runs them).

``prepare(op, triton)`` picks once per block op how it runs, as ``kernels.prepare`` does for numpy:
contractions as ``torch.einsum`` (cuBLAS); equality gathers (embeddings, their scatter-add
gradients) as torch indexing; ``outer * sum(inner)`` (``kernels.factored_parts``) as that sum
times its outer factors; a cast or broadcast of one operand as a view and a ``.to``; every other
join as one Triton kernel generated from its expression tree (as ccodegen.py generates C),
fused with its aggregation, its source depending on the op's form only (sizes and strides
are arguments; dims that walk memory together merge at the call), cached per form. Where
Triton is off or a join has no Triton form (integers, f64, complex, most ``pow``s) the tree is
evaluated with torch ops. Half precision computes in f32 and rounds once, at the end (kernels.py's
rule). A result may be a view; the engine never writes into a block it did not make.

    kernel = prepare(op, triton=False)
    out = kernel([torch.ones(2, 3), torch.ones(3)], variables={})
"""

from __future__ import annotations

import functools
import linecache
import math
from collections.abc import Callable, Sequence

import torch

from einsummable.engines.kernels.fast import factored_parts
from einsummable.engines.kernels.reference import kept_wide
from einsummable.errors import Unsupported
from einsummable.ir import scalar
from einsummable.ir.dtypes import HALF
from einsummable.ir.einsummable import IDENTITY, Einsummable, letter
from einsummable.ir.expr import Call, Cast, Expr, Input, inputs_used
from einsummable.ir.kinds import equality_gather
from einsummable.ir.scalar_ops import expand, is_call

TORCH = {"bool": torch.bool, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
         "f64": torch.float64, "c64": torch.complex64, "i32": torch.int32, "i64": torch.int64}
Kernel = Callable[[Sequence[torch.Tensor], dict], torch.Tensor]


def working(dtype: str | None) -> torch.dtype | None:
    """The torch dtype values of ``dtype`` are computed in: f32 for the half types."""
    return None if dtype is None else torch.float32 if dtype in HALF else TORCH[dtype]


def align(t: torch.Tensor, idx: tuple[int, ...], join_shape: tuple[int, ...]) -> torch.Tensor:
    """A view of an operand with its axes in join order, size 1 along the indices it lacks."""
    axes = sorted(range(len(idx)), key=idx.__getitem__)
    return t.permute(axes).reshape([n if i in idx else 1 for i, n in enumerate(join_shape)])


@functools.lru_cache(maxsize=8192)
def prepare(op: Einsummable, triton: str | None = None) -> Kernel:
    """The kernel for ``op``, chosen once; it returns a tensor of ``op.dtype`` and ``op.out_shape``.
    ``triton``: None (torch ops only), ``"cuda"`` (compiled) or ``"interpret"`` (Triton's interpreter)."""
    dtype, shape = TORCH[op.dtype], op.out_shape
    body = _body(kept_wide(op) or op, triton, top=op)

    def kernel(arrays: Sequence[torch.Tensor], variables: dict) -> torch.Tensor:
        result = body(arrays, variables)
        if result.dtype != dtype:
            result = result.to(dtype)  # half precision rounds here, once
        return result if tuple(result.shape) == shape else result.expand(shape)

    return kernel


def _body(op: Einsummable, triton: str | None, top: Einsummable | None = None) -> Kernel:
    """The work before the final cast: half precision may come back in f32. ``top``: the op
    ``prepare`` was asked for, whose dtype a generated kernel may store directly."""
    if op.is_contraction():
        return _contraction(op)
    if (match := equality_gather(op)) is not None:
        return lambda arrays, variables: _gather(op, arrays, *match)
    if len(op.inputs) == 1 and op.agg is None and op.join in (IDENTITY, Cast(op.dtype, IDENTITY)):
        return lambda arrays, variables: align(arrays[0], op.inputs[0], op.join_shape)
    if (parts := factored_parts(op)) is not None:
        return _factored(parts, triton)
    if triton and (generated := triton_kernel(top or op, triton)) is not None:
        return generated
    return _eager(op)


def _contraction(op: Einsummable) -> Kernel:
    """``torch.einsum``; half precision on CUDA stays half (cuBLAS accumulates in f32 and rounds
    once), elsewhere it is widened first. A kept-wide sum (f32 out) is widened everywhere."""
    present = [i for i in range(op.out_rank) if any(i in idx for idx in op.inputs)]
    subs = ",".join("".join(letter(i) for i in idx) for idx in op.inputs)
    spec = f"{subs}->{''.join(letter(i) for i in present)}"
    shape = [op.join_shape[i] if i in present else 1 for i in range(op.out_rank)]
    half = op.dtype in HALF

    def body(arrays, variables):
        if half and (arrays[0].device.type != "cuda" or op.dtype != op.dtypes[0]):
            arrays = [a.float() for a in arrays]
        return torch.einsum(spec, *arrays).reshape(shape)

    return body


def _factored(parts, triton: str | None) -> Kernel:
    """``outer * sum(inner)``, each an einsummable over the operands it reads (kernels._factored)."""
    (inner, s_used), (outer, o_used) = parts
    summed = _body(inner, triton)
    scale = _body(outer, triton) if o_used else outer

    def body(arrays, variables):
        total = summed([arrays[k] for k in s_used], variables)
        if not o_used:
            return total * scalar.constant_value(scale, variables)
        return total * scale([arrays[k] for k in o_used], variables)

    return body


# ----------------------------------------------------------------- gathers

def _gather(op: Einsummable, arrays: Sequence[torch.Tensor], a: int, b: int, c: int) -> torch.Tensor:
    """kernels._gather with torch: where xa == xb, gather xc and scatter-add into the output."""
    js, outs = op.join_shape, set(range(op.out_rank))
    m_idx = sorted(set(op.inputs[a]) | set(op.inputs[b]))
    mask = align(arrays[a], op.inputs[a], js) == align(arrays[b], op.inputs[b], js)
    mask = mask.expand([js[i] if i in m_idx else 1 for i in range(op.rank)])
    coords = dict(zip(m_idx, torch.nonzero(mask.reshape([js[i] for i in m_idx]), as_tuple=True), strict=True))
    c_idx, xc = op.inputs[c], arrays[c]
    acc = torch.float32 if op.dtype in HALF else None
    summed = tuple(k for k, i in enumerate(c_idx) if i not in outs and i not in coords)
    if summed:
        xc = xc.sum(dim=summed, dtype=acc)
        c_idx = tuple(i for i in c_idx if i in outs or i in coords)
    fixed_c = [i for i in c_idx if i in coords]
    free = [i for i in c_idx if i not in coords]
    xc = xc.permute([c_idx.index(i) for i in fixed_c + free])
    gathered = xc[tuple(coords[i] for i in fixed_c)] if fixed_c else xc
    if not fixed_c:
        gathered = gathered.expand(len(next(iter(coords.values()))), *gathered.shape)
    if acc is not None:
        gathered = gathered.to(acc)
    fixed_out = [i for i in range(op.out_rank) if i in coords]
    if fixed_out:
        target = torch.zeros([js[i] for i in fixed_out + free], dtype=gathered.dtype, device=xc.device)
        target.index_put_(tuple(coords[i] for i in fixed_out), gathered, accumulate=True)
    else:
        target = gathered.sum(dim=0)
    present = fixed_out + free
    target = target.permute([present.index(i) for i in sorted(present)])
    return target.reshape([js[i] if i in present else 1 for i in range(op.out_rank)])


# ----------------------------------------------------------------- the torch fallback

def _pow(a, c: float):
    special = {2: lambda: a * a, 0.5: lambda: torch.sqrt(a), -1: lambda: torch.reciprocal(a), 1: lambda: a}
    if c in special:  # interpret.py's special exponents
        return special[c]()
    return torch.pow(a, int(c) if not a.is_floating_point() and not a.is_complex() else c)


def _binary(fn):
    """torch.minimum and maximum take tensors only: a scalar operand becomes one like the other."""
    def run(a, b):
        like = a if isinstance(a, torch.Tensor) else b
        return fn(*(torch.tensor(x, dtype=like.dtype, device=like.device) if not isinstance(x, torch.Tensor)
                    else x for x in (a, b)))
    return run


EAGER: dict[str, Callable] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "neg": lambda a: -a, "abs": torch.abs, "exp": torch.exp,
    "log": torch.log, "sqrt": torch.sqrt, "rsqrt": lambda a: torch.reciprocal(torch.sqrt(a)),
    "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": lambda a: 1.0 / (1.0 + torch.exp(-a)),  # ir/scalar_ops.py's forms, step for step
    "silu": lambda a: a / (1.0 + torch.exp(-a)), "relu": lambda a: torch.clamp(a, min=0),
    "min": _binary(torch.minimum), "max": _binary(torch.maximum),
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "where": lambda c, a, b: torch.where(c, a, b), "stop_gradient": lambda a: a,
    "conj": lambda a: torch.conj(a).resolve_conj(), "real": torch.real, "imag": torch.imag,
}
REDUCE = {"add": lambda t, dims: t.sum(dim=dims), "mul": lambda t, dims: t.flatten(-len(dims)).prod(-1),
          "min": lambda t, dims: t.amin(dim=dims), "max": lambda t, dims: t.amax(dim=dims)}


def _eager(op: Einsummable) -> Kernel:
    """The join evaluated node by node with torch ops, over broadcast views, then reduced."""
    dtypes, js = op.dtypes, op.join_shape
    dims = op.aggregated

    def body(arrays, variables):
        views = [align(a.to(working(d)), idx, js)
                 for a, idx, d in zip(arrays, op.inputs, dtypes, strict=True)]
        joined = evaluate(expand(op.join), dtypes, views, variables, working(op.dtype))
        if not isinstance(joined, torch.Tensor):
            device = arrays[0].device if arrays else None
            joined = torch.tensor(joined, dtype=working(op.dtype), device=device)
        if op.agg is None:
            return joined
        result = REDUCE[op.agg](joined.expand(js), dims) if dims else joined.expand(js)
        return result.to(working(op.dtype)) if result.dtype != working(op.dtype) else result

    return body


def evaluate(e: Expr, dtypes: Sequence[str], views: Sequence[torch.Tensor], variables: dict,
             default: torch.dtype | None) -> torch.Tensor | float:
    """The join's value over ``views`` (inputs in their working dtype), each step in its own."""
    memo: dict[Expr, object] = {}

    def value(x: Expr):
        if x in memo:
            return memo[x]
        if isinstance(x, Input):
            out = views[x.index]
        elif not inputs_used(x):
            out = scalar.constant_value(x, variables)  # constants and variables: folded in double
            d = scalar.dtype_of(x, dtypes)
            if d is not None and working(d) is not None and not working(d).is_floating_point:
                out = int(out.real) if working(d) != torch.bool else bool(out)
        elif isinstance(x, Cast):
            arg = value(x.arg)
            out = arg.to(TORCH[x.dtype]).to(torch.float32) if x.dtype in HALF else arg.to(TORCH[x.dtype])
        elif is_call(x, "pow"):
            out = _pow(value(x.args[0]), x.args[1].value)
        else:
            assert isinstance(x, Call)
            step = working(scalar.dtype_of(x, dtypes)) or default
            args = [value(a) for a in x.args]
            if step is not None and not (step.is_floating_point or step.is_complex or step == torch.bool):
                args = [int(a) if isinstance(a, float) else a for a in args]
            out = EAGER[x.op](*args)
            if isinstance(out, torch.Tensor) and step is not None and out.dtype not in (step, torch.bool):
                out = out.to(step)
        memo[x] = out
        return out

    return value(e)


# ----------------------------------------------------------------- Triton

FLOATS = ("f32", "bf16", "f16")
IDENT = {"add": "0.0", "mul": "1.0", "min": "INF", "max": "NINF"}
NAN = "propagate_nan=tl.PropagateNan.ALL"  # np.minimum and np.maximum propagate NaN
# The aggregations' combine functions, generated beside each kernel: tl.sum and tl.max are
# jit functions of Triton's own, which its interpreter runs only if set before Triton loads.
COMBINE = {"add": "a + b", "mul": "a * b", "min": f"tl.minimum(a, b, {NAN})",
           "max": f"tl.maximum(a, b, {NAN})"}
UNARY = {"neg": "(-{0})", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "log": "tl.log({0})",
         "sqrt": "tl.sqrt_rn({0})", "rsqrt": "(1.0 / tl.sqrt_rn({0}))", "sin": "tl.sin({0})",
         "cos": "tl.cos({0})", "sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))",
         "silu": "({0} / (1.0 + tl.exp(-{0})))",
         "relu": f"tl.maximum({{0}}, 0.0, {NAN})", "stop_gradient": "{0}"}
BINARY = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
          "min": f"tl.minimum({{0}}, {{1}}, {NAN})", "max": f"tl.maximum({{0}}, {{1}}, {NAN})",
          "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
          "eq": "({0} == {1})", "ne": "({0} != {1})"}


class _Emitter:
    """The join as Triton statements in f32, one temporary per step; subexpressions of
    constants and run-time variables become scalar arguments, folded on the host."""

    def __init__(self, op: Einsummable) -> None:
        self.op = op
        self.lines: list[str] = []
        self.scalars: list[Expr] = []
        self.memo: dict[Expr, str] = {}
        self.used = sorted(inputs_used(op.join))

    def emit(self, e: Expr) -> str:
        if e not in self.memo:
            self.memo[e] = self._emit(e)
        return self.memo[e]

    def temp(self, code: str) -> str:
        self.lines.append(f"t{len(self.lines)} = {code}")
        return f"t{len(self.lines) - 1}"

    def _emit(self, e: Expr) -> str:
        if isinstance(e, Input):
            return f"v{self.used.index(e.index)}"
        if not inputs_used(e):
            if scalar.dtype_of(e, self.op.dtypes) is not None:  # a boolean or complex constant
                raise Unsupported("a typed constant")
            self.scalars.append(e)
            return f"C{len(self.scalars) - 1}"
        if scalar.dtype_of(e, self.op.dtypes) not in (*FLOATS, "bool", None):  # None: weak, f32 here
            raise Unsupported(f"a step of dtype {scalar.dtype_of(e, self.op.dtypes)}")
        if isinstance(e, Cast):
            arg = self.emit(e.arg)
            if e.dtype == "f32":
                return self.temp(f"({arg}).to(tl.float32)")  # a half value is f32 here already
            if e.dtype == "bf16":  # to nearest even by hand: the interpreter's cast truncates
                b = self.temp(f"({arg}).to(tl.uint32, bitcast=True)")
                r = self.temp(f"((({b} + 0x7FFF + (({b} >> 16) & 1)) >> 16) << 16)"
                              ".to(tl.float32, bitcast=True)")
                return self.temp(f"tl.where({arg} != {arg}, {arg}, {r})")  # NaN stays NaN
            if e.dtype == "f16":
                return self.temp(f"({arg}).to(tl.float16).to(tl.float32)")  # rounds, stays f32
            raise Unsupported(f"cast to {e.dtype}")
        assert isinstance(e, Call)
        if e.op == "pow":
            return self._pow(e)
        args = [self.emit(a) for a in e.args]
        if e.op == "where":
            return self.temp(f"tl.where({args[0]}, {args[1]}, {args[2]})")
        if e.op == "tanh":  # no tl.tanh: (1 - e^-2|x|) / (1 + e^-2|x|), signed
            t = self.temp(f"tl.exp(-2.0 * tl.abs({args[0]}))")
            r = self.temp(f"(1.0 - {t}) / (1.0 + {t})")
            return self.temp(f"tl.where({args[0]} < 0.0, -{r}, {r})")
        table = UNARY if len(args) == 1 else BINARY
        if e.op not in table:
            raise Unsupported(e.op)
        return self.temp(table[e.op].format(*args))

    def _pow(self, e: Call) -> str:
        base, c = self.emit(e.args[0]), e.args[1].value
        if c == 0.5:
            return self.temp(f"tl.sqrt_rn({base})")
        if isinstance(c, complex) or c != int(c) or not 1 <= abs(c) <= 4:
            raise Unsupported(f"pow by {c}")
        product = " * ".join([base] * int(abs(c)))
        return self.temp(f"({product})" if c > 0 else f"(1.0 / ({product}))")


def triton_kernel(op: Einsummable, mode: str = "cuda") -> Kernel | None:
    """The generated kernel's launcher for ``op``, or None where the join has no Triton form."""
    if not inputs_used(op.join) or any(d not in FLOATS for d in (*op.dtypes, op.dtype)):
        return None
    try:
        emitter = _Emitter(op)
        root = emitter.emit(expand(op.join))
    except Unsupported:
        return None
    form = (tuple(emitter.lines), root, len(emitter.used), len(emitter.scalars), op.agg)
    used, scalars = emitter.used, tuple(emitter.scalars)
    out_dtype, js, p = TORCH[op.dtype], op.join_shape, op.out_rank
    # the interpreter truncates f32 to bf16: it stores f32 there, and torch rounds
    store = torch.float32 if mode == "interpret" and out_dtype == torch.bfloat16 else out_dtype

    def launch(arrays, variables):
        views = [align(arrays[k], op.inputs[k], js).expand(js) for k in used]
        out = torch.empty(op.out_shape, dtype=store, device=views[0].device)
        if out.numel() == 0:
            return out
        outer = _collapse([(js[d], [v.stride(d) for v in views] + [out.stride(d)]) for d in range(p)])
        inner = _collapse([(js[d], [v.stride(d) for v in views]) for d in range(p, len(js))])
        n_out, n_agg = out.numel(), math.prod(js[p:])
        if op.agg is not None and n_agg == 0:
            return _eager(op)(arrays, variables).to(out_dtype)
        fn = _compiled(form, len(outer), len(inner) if op.agg else 0, mode == "interpret")
        block_k = min(128, _pow2(n_agg)) if op.agg else 1
        block_m = max(16, min(1024 if not op.agg else 4096 // block_k, _pow2(n_out)))
        consts = [float(scalar.constant_value(s, variables)) for s in scalars]
        sizes = [n for n, _ in outer] + [n for n, _ in inner]
        strides = [s[k] for k in range(len(views)) for _, s in outer] + \
                  [s[k] for k in range(len(views)) for _, s in inner] + [s[-1] for _, s in outer]
        grid = (-(-n_out // block_m),)
        fn[grid](*views, out, *consts, n_out, n_agg, *sizes, *strides, BLOCK_M=block_m, BLOCK_K=block_k)
        return out.to(out_dtype)

    return launch


def _collapse(dims: list[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
    """Drop size-1 dims and merge neighbours that every tensor walks as one (row-major)."""
    out: list[tuple[int, list[int]]] = []
    for n, strides in dims:
        if n == 1:
            continue
        if out and all(sp == sn * n for sp, sn in zip(out[-1][1], strides, strict=True)):
            out[-1] = (out[-1][0] * n, strides)
        else:
            out.append((n, strides))
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=1024)
def _compiled(form: tuple, p: int, q: int, interpret: bool):
    """The Triton function of one form, with ``p`` output and ``q`` aggregated dims, compiled
    (``triton.jit``) or for Triton's interpreter (what ``TRITON_INTERPRET=1`` makes of ``jit``)."""
    import triton
    import triton.language as tl

    lines, root, n_in, n_scalars, agg = form
    name = "join_" + format(abs(hash((form, p, q))), "x")
    ind = " " * (8 if q else 4)
    args = [f"X{k}" for k in range(n_in)] + ["OUT"] + [f"C{j}" for j in range(n_scalars)]
    args += ["N_OUT", "N_AGG"] + [f"N{d}" for d in range(p)] + [f"NA{d}" for d in range(q)]
    args += [f"S{k}_{d}" for k in range(n_in) for d in range(p)]
    args += [f"T{k}_{d}" for k in range(n_in) for d in range(q)] + [f"O{d}" for d in range(p)]
    src = ["def _combine(a, b):", f"    return {COMBINE[agg or 'add']}", "", "",
           f"def {name}({', '.join(args)}, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):",
           "    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)",
           "    m_ok = m < N_OUT", "    rem = m"]
    src += _unflatten("i", "N", p, "    ")
    for k in range(n_in):
        src.append(f"    base{k} = m * 0" + "".join(f" + i{d} * S{k}_{d}" for d in range(p)))
    src.append("    out_at = m * 0" + "".join(f" + i{d} * O{d}" for d in range(p)))
    if q:
        src += [f"    acc = tl.full([BLOCK_M], {IDENT[agg]}, tl.float32)",
                "    for k0 in range(0, N_AGG, BLOCK_K):",
                "        k = (k0 + tl.arange(0, BLOCK_K)).to(tl.int64)",
                "        ok = m_ok[:, None] & (k < N_AGG)[None, :]", "        rem = k"]
        src += _unflatten("j", "NA", q, ind)
        for k in range(n_in):
            at = "k * 0" + "".join(f" + j{d} * T{k}_{d}" for d in range(q))
            src.append(f"{ind}v{k} = tl.load(X{k} + base{k}[:, None] + ({at})[None, :], mask=ok, "
                       "other=1.0).to(tl.float32)")
    else:
        src += [f"    v{k} = tl.load(X{k} + base{k}, mask=m_ok, other=1.0).to(tl.float32)"
                for k in range(n_in)]
    src += [ind + line for line in lines]
    if q:
        src += [f"        r = tl.where(ok, {root}, {IDENT[agg]})",
                "        acc = _combine(acc, tl.reduce(r, 1, _combine))",
                "    tl.store(OUT + out_at, acc.to(OUT.dtype.element_ty), mask=m_ok)"]
    else:  # elementwise, or a reduction over dims of size 1 only: the join is the value
        src.append(f"    tl.store(OUT + out_at, ({root}).to(OUT.dtype.element_ty), mask=m_ok)")
    text = "\n".join(src) + "\n"
    filename = f"<einsummable-triton {name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)  # Triton reads it
    namespace = {"triton": triton, "tl": tl, "INF": tl.constexpr(math.inf), "NINF": tl.constexpr(-math.inf)}
    exec(compile(text, filename, "exec"), namespace)
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction as jit
    else:
        jit = triton.jit
    namespace["_combine"] = jit(namespace["_combine"])  # the kernel finds its combine function here
    return jit(namespace[name])


def _unflatten(prefix: str, sizes: str, n: int, ind: str) -> list[str]:
    """Row-major coordinates of the flat index ``rem``: innermost dim last."""
    out = []
    for d in range(n - 1, 0, -1):
        out += [f"{ind}{prefix}{d} = rem % {sizes}{d}", f"{ind}rem = rem // {sizes}{d}"]
    return [*out, f"{ind}{prefix}0 = rem"] if n else out
