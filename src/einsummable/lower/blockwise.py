"""Lowering a node at a time, vectorised over its blocks, into a CompactGraph.

The same TaskGraph as lowering.py (same tasks, same order), built for the
cluster-level plan, where every worker is a machine (lower/cluster.py): there a
piece crosses once per (block, sub-box, machine) anyway, so lowering.py's relays
and per-machine gathers do nothing and are left out. A node's blocks are numpy
rows: their boxes, machines and the operand boxes they read. ``fetch`` answers
all the reads of one producer at once:
- the producer blocks each box meets, per dimension (``searchsorted``), expanded
  to pieces (row-major, as ``Partition.overlapping``);
- each piece's partial sums grouped by machine, the reader's machine first (a
  Python loop, only for producers whose blocks are partial sums), summed where
  they live, then moved; the pieces assembled by a partial; a wide partial sum
  rounded once (a cast).
Partials (assemble.py) are made in batches of the same piece count. Tasks come
out in lowering.py's order (arrays.py): every request carries its place (block,
operand, piece, step) and each node's new tasks are sorted by it.

What does not depend on task ids (a fetch's pieces, moves and assembly, an
einsum's blocks and operand boxes, a select's pieces) is worked out once per
distinct geometry and replayed (geometry.py, selects.py): Llama's layers repeat it.
A value's index entries and fetch cache go once no node to come reads its tasks
(``readers``). Cost at 32 machines × 64 cores (Llama-7B training,
benchmarks/lower_scale.py): about 3 µs (CPU) per task, 37 bytes kept and about 100
at the peak of lowering.

    cg = lower_blocks(machine_plan(plan))     # a CompactGraph
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace

import numpy as np

from einsummable.errors import PlanError
from einsummable.ir.dtypes import HALF
from einsummable.ir.expr import Cast
from einsummable.ir.graph import (
    ComplexView,
    Constant,
    EinsumNode,
    Fill,
    Formation,
    InputNode,
    Reshape,
    Select,
)
from einsummable.lower.arrays import Builder
from einsummable.lower.compact import APPLY, INPUT, MOVE, VIEW, CompactGraph, prune
from einsummable.lower.geometry import INNER, Geometry, Operands, Requests, geometry, grid, key
from einsummable.lower.lowering import stored
from einsummable.lower.prefetch import prefetch
from einsummable.lower.selects import SelectGeometry, Selects
from einsummable.lower.taskgraph import Output
from einsummable.plan.partition import Partition
from einsummable.plan.plan import Plan


@dataclass
class Held:
    """A node's value: per output block q, the tasks holding it (R partial sums) and their machines."""

    part: Partition
    task: np.ndarray  # [Q, R]
    loc: np.ndarray  # [Q, R]
    kept: str  # their dtype (f32 for half partial sums)
    sig: int = -1  # the same for Helds of the same partition, machines and dtype (the geometry's cache)


class _Lower(Selects):
    def __init__(self, plan: Plan) -> None:
        self.g, self.plan = plan.graph, plan
        super().__init__(Builder(plan.cluster.workers, plan.cluster.cores))
        self.outs: dict[int, Held] = {}
        self.fetched: dict[int, dict] = {}
        self.requests: dict[bytes, Requests] = {}
        self.geometries: dict[tuple, Geometry] = {}
        self.einsums: dict[tuple, Operands] = {}
        self.selects: dict[tuple, SelectGeometry] = {}
        self.sigs: dict[tuple, int] = {}
        self.shared, self.release_at = self.readers()

    def holds(self) -> list[bool]:
        """Per node: may its blocks be tasks that other nodes' blocks are too? A select's
        may be its inputs' blocks as they are (a block it reads whole, where it is), and
        a formation's, unless its input's blocks are partial sums (they sum into new
        tasks). And a select, formation or view of a value that other nodes read too may
        make the same tasks as one of those (the index finds them): the same views of the
        same blocks, the same sums of the same partial sums."""
        plan, g = self.plan, self.g
        users = g.users()
        out = []
        for node in g.nodes:
            keeps = isinstance(node, Select) or (isinstance(node, Formation) and
                                                 plan.parts[node.inputs[0]].num_blocks ==
                                                 plan.out_partition(node.inputs[0]).num_blocks)
            same = (isinstance(node, Select | Formation | Reshape | ComplexView)
                    and any(len(set(users[x])) > 1 for x in node.inputs))
            out.append(keeps or same)
        return out

    def readers(self) -> tuple[list[bool], dict[int, list[int]]]:
        """Per node: can more than one node read its tasks? Those of a value read by one
        node are fetched in one batch, so their moves and partials need no index and no
        cache; but a node that holds its inputs' tasks (``holds``) shares them with its
        readers. And per node n: the nodes whose tasks no node after n reads (a holder's
        readers read its inputs' tasks too), so that the index entries made from their
        tasks (moves, sums, casts, views) and their fetches can go after n."""
        g, holds = self.g, self.holds()
        parent = list(range(len(g.nodes)))  # one group: a holder and its inputs

        def find(v: int) -> int:
            while parent[v] != v:
                parent[v] = v = parent[parent[v]]
            return v

        for v, node in enumerate(g.nodes):
            for x in node.inputs if holds[v] else ():
                parent[find(x)] = find(v)
        root = [find(v) for v in range(len(parent))]
        users = g.users()
        readers: dict[int, set[int]] = {}
        for v, us in enumerate(users):
            readers.setdefault(root[v], set()).update(us)
        life = [-1] * len(g.nodes)
        for v in reversed(range(len(g.nodes))):
            for r in users[v]:
                life[v] = max(life[v], r, life[r] if holds[r] else -1)
        for v, node in enumerate(g.nodes):  # a holder's fetches make entries from its inputs' tasks
            if holds[v]:
                life[v] = max([life[v], *(life[x] for x in node.inputs)])
        at: dict[int, list[int]] = {}
        for v, n in enumerate(life):
            at.setdefault(n, []).append(v)
        return [len(readers[r]) > 1 for r in root], at

    # ------------------------------------------------------------ fetch

    def fetch(self, u: int, lo: np.ndarray, hi: np.ndarray, w: np.ndarray, pre: np.ndarray,
              k: bytes | None = None) -> np.ndarray:
        """Tasks holding box [lo, hi) of node u's value at machine w, one per row; ``pre``
        orders the requests as lowering.py makes them (all of a node's reads of u at once);
        ``k``: their ``key``, where the caller has it."""
        node = self.g.nodes[u]
        if isinstance(node, Fill):
            return self.constants(node.kind, node.dtype, lo, hi, w, pre * INNER)
        if k is None:
            k = key(lo, hi, w, pre)
        r = self.requests.get(k)
        if r is None:
            r = self.requests[k] = Requests(lo, hi, w, pre)
        self.b.owner = u  # what _fetch adds to the index goes with u's tasks (``readers``)
        try:
            if not self.shared[u]:
                return self._fetch(u, r.lo, r.hi, r.w, r.low, k)[r.inv]
            return self.fetch_shared(u, r, k)
        finally:
            self.b.owner = None

    def fetch_shared(self, u: int, r: Requests, k: bytes) -> np.ndarray:
        """``fetch`` of a value that several nodes read: each read at most once over all of them.
        Reads that are all u's blocks in place need no cache: they are those blocks' tasks."""
        geo = self.geometry(u, r.lo, r.hi, r.w, r.low, k)
        if geo.exact is not None:
            return self.outs[u].task[geo.exact, 0][r.inv]
        cache = self.fetched.setdefault(u, {})
        keys = r.keys()
        got = np.array([cache.get(b, -1) for b in keys], dtype=np.int64)
        miss = np.flatnonzero(got < 0)
        if len(miss):
            sub = k if len(miss) == len(keys) else k + miss.tobytes()
            got[miss] = self._fetch(u, r.lo[miss], r.hi[miss], r.w[miss], r.low[miss], sub)
            for j in miss.tolist():
                self.b.remember(cache, keys[j], int(got[j]))
        return got[r.inv]

    def _fetch(self, u: int, lo: np.ndarray, hi: np.ndarray, w: np.ndarray, pre: np.ndarray,
               where: bytes) -> np.ndarray:
        """``fetch`` of distinct boxes; ``where`` identifies (lo, hi, w, pre) for the geometry's cache."""
        h = self.outs[u]
        node = self.g.nodes[u]
        geo = self.geometry(u, lo, hi, w, pre, where)
        if geo.exact is not None:
            return h.task[geo.exact, 0]
        agg = node.op.agg if isinstance(node, EinsumNode) else None
        kept = self.dt(h.kept)
        ids, shared = geo.ids, self.shared[u]
        tasks = h.task.ravel()
        t = tasks[geo.take]
        for s in geo.sums:
            if s.piece not in ids:
                ids[s.piece] = self.b.shape_ids(np.array([s.size]))[0]
            k = len(s.tasks)
            top = [a + n for a, n in zip(s.lo, s.size, strict=True)]
            t[s.piece] = self.partial(tasks[s.tasks].tolist(), [s.lo] * k, [top] * k,
                                      [[0] * len(s.size)] * k, ids[s.piece], kept, agg, s.loc, 0.0, s.order)
        if len(geo.away):
            if "move" not in ids:
                ids["move"] = (self.b.shape_ids(geo.move_size),
                               self.b.box_ids("move", None, geo.move_slo, geo.move_shi))
            shape, aux = ids["move"]
            src = t[geo.away]
            keys = np.concatenate([src[:, None], geo.move_keys], axis=1)
            t[geo.away] = self.b.emit(MOVE, keys, geo.move_order, loc=keys[:, -1], src=keys[:, -2],
                                      dtype=kept, shape=shape, aux=aux, inputs=src[:, None], shared=shared,
                                      ids_at=(0,))
        m = len(lo)
        out = np.full(m, -1, dtype=np.int64)
        out[geo.one] = t[geo.one_piece]
        if len(geo.empty):
            e = geo.empty
            size = hi[e] - lo[e]
            out[e] = self.constants(Constant(0.0), h.kept, np.zeros_like(size), size, w[e],
                                    pre[e] * INNER + INNER - 2, memo=ids.setdefault("empty", {}))
        if geo.groups:
            if "rest" not in ids:
                rest = np.sort(np.concatenate([f for f, *_ in geo.groups]))  # interned in the uncached order
                ids["rest"] = np.zeros(m, dtype=np.int64)
                ids["rest"][rest] = self.b.shape_ids(hi[rest] - lo[rest])
            shapes = ids["rest"]
            for c, (f, j, slo, shi, dst) in enumerate(geo.groups):
                order = pre[f] * INNER + INNER - 2
                out[f] = self.partials(t[j], slo, shi, dst, shapes[f], kept, agg, w[f], 0.0, order, shared,
                                       memo=ids.setdefault(("group", c), {}))
        if h.kept != node.dtype:  # the formed block: the wide partial sum rounds, once
            out = self.cast(u, node.dtype, h.kept, out, hi - lo, w, pre * INNER + INNER - 1, shared,
                            memo=ids.setdefault("cast", {}))
        return out

    def geometry(self, u: int, lo: np.ndarray, hi: np.ndarray, w: np.ndarray, pre: np.ndarray,
                 where: bytes) -> Geometry:
        """The geometry of a ``_fetch`` (geometry.py), cached by its producer's ``sig`` and ``where``."""
        h, node = self.outs[u], self.g.nodes[u]
        k = (h.sig, node.dtype, node.op.agg if isinstance(node, EinsumNode) else None, where)  # ids hold agg
        geo = self.geometries.get(k)
        if geo is None:
            bounds = [np.array(b, dtype=np.int64) for b in h.part.bounds]
            geo = self.geometries[k] = geometry(bounds, h.part.counts, h.loc, h.task.shape[1],
                                                h.kept == node.dtype, lo, hi, w, pre)
        return geo

    # ------------------------------------------------------------ rules per node kind

    def reads(self, nid: int, k: int, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The box of operand k that each space block reads (``Space.operand_box``)."""
        sp, u = self.plan.spaces[nid], self.g.nodes[nid].inputs[k]
        shape = self.g.nodes[u].shape
        olo = np.zeros((len(lo), len(shape)), dtype=np.int64)
        ohi = np.tile(np.array(shape, dtype=np.int64), (len(lo), 1))
        for a, d in enumerate(sp.operands[k]):
            if d is not None:
                olo[:, a], ohi[:, a] = lo[:, d], hi[:, d]
        return olo, ohi

    def einsum(self, nid: int, w: np.ndarray) -> Held:
        node: EinsumNode = self.g.nodes[nid]
        us, sp = node.inputs, self.plan.spaces[nid]
        k = (self.plan.parts[nid], w.tobytes(), node.op, sp, tuple(self.g.nodes[u].shape for u in us),
             tuple(us.index(u) for u in us))
        e = self.einsums.get(k)
        if e is None:
            e = self.einsums[k] = self.operands(nid, w)
        nb, nk = len(w), len(us)
        args = np.empty((nb, nk), dtype=np.int64)
        for ks, lo, hi, bw, pre, where in e.batches:  # the operands read from one producer, at once
            args[:, ks] = self.fetch(us[ks[0]], lo, hi, bw, pre, where).reshape(len(ks), nb).T
        if "ops" not in e.ids:  # interned after the fetches, as when nothing was cached
            ops = np.zeros(nb, dtype=np.int64)
            shapes = e.shapes
            uniq, inv = (np.unique(shapes, axis=0, return_inverse=True) if shapes.shape[1]
                         else (shapes[:1], ops))
            for j, shape in enumerate(uniq.tolist()):
                ops[inv.ravel() == j] = self.b.intern("aux", e.op.block(shape))
            e.ids["ops"] = ops, self.dt(e.dtype), self.b.shape_ids(shapes[:, :e.op.out_rank])
        ops, dt, shape = e.ids["ops"]
        keys = np.concatenate([ops[:, None], args, w[:, None], np.full((nb, 1), nid)], axis=1)
        ids = self.b.emit(APPLY, keys, e.order, loc=w, node=nid, dtype=dt, shape=shape, aux=ops, inputs=args,
                          shared=False)
        q = e.out.num_blocks
        return Held(e.out, ids.reshape(q, nb // q), w.reshape(q, nb // q), e.dtype)

    def operands(self, nid: int, w: np.ndarray) -> Operands:
        """An einsum's blocks and what they read of each producer (``einsum`` caches it)."""
        node: EinsumNode = self.g.nodes[nid]
        part = self.plan.parts[nid]
        out = self.plan.out_partition(nid)
        op = node.op
        if part.num_blocks > out.num_blocks and op.dtype in HALF and op.agg in ("add", "mul"):
            op = replace(op, join=Cast("f32", op.join))  # partial sums: kept in f32 until formed
        lo, hi = grid(part)
        nb, nk = len(lo), len(node.inputs)
        reads = [self.reads(nid, k, lo, hi) for k in range(nk)]
        batches = []
        for u in dict.fromkeys(node.inputs):  # in the order lowering.py reads them
            ks = [k for k, v in enumerate(node.inputs) if v == u]
            blo, bhi = (np.concatenate([reads[k][j] for k in ks]) for j in range(2))
            bw = np.tile(w, len(ks))
            pre = np.concatenate([np.arange(nb) * (nk + 1) + k for k in ks])
            batches.append((ks, blo, bhi, bw, pre, key(blo, bhi, bw, pre)))
        return Operands(out, op, op.dtype, hi - lo, batches, (np.arange(nb) * (nk + 1) + nk) * INNER)

    def single(self, nid: int, w: np.ndarray, make) -> Held:
        """A node whose output blocks are its space blocks, one task each."""
        part = self.plan.parts[nid]
        lo, hi = grid(part)
        ids = make(lo, hi)
        return Held(part, ids[:, None], w[:, None], self.g.nodes[nid].dtype)

    def rule(self, nid: int, w: np.ndarray) -> Held:
        node = self.g.nodes[nid]
        nb = len(w)
        if isinstance(node, EinsumNode):
            return self.einsum(nid, w)
        if isinstance(node, InputNode):
            def make(lo, hi):
                aux = self.b.box_ids("input", node.name, lo, hi)
                keys = np.stack([aux, np.full(nb, self.dt(node.dtype)), w], axis=1)
                return self.b.emit(INPUT, keys, np.arange(nb) * INNER, loc=w, dtype=self.dt(node.dtype),
                                   shape=self.b.shape_ids(hi - lo), aux=aux, shared=False)
            return self.single(nid, w, make)
        if isinstance(node, Fill):
            return self.single(nid, w, lambda lo, hi: self.constants(node.kind, node.dtype, lo, hi, w,
                                                                     np.arange(nb) * INNER))
        if isinstance(node, Formation):
            u = node.inputs[0]
            if not self.plan.spaces[u].aggregated:
                return self.outs[u]
            return self.single(nid, w, lambda lo, hi: self.fetch(u, lo, hi, w, np.arange(nb)))
        if isinstance(node, Select):
            return self.single(nid, w, lambda lo, hi: self.select(node, self.plan.parts[nid], lo, hi, w))
        if isinstance(node, Reshape | ComplexView):
            def view(lo, hi):
                src = self.fetch(node.inputs[0], *self.reads(nid, 0, lo, hi), w, np.arange(nb) * 2)
                keys = np.stack([src, np.full(nb, self.dt(node.dtype)), self.b.shape_ids(hi - lo), w], axis=1)
                self.b.owner = node.inputs[0]
                ids = self.b.emit(VIEW, keys, (np.arange(nb) * 2 + 1) * INNER, loc=w, dtype=keys[:, 1],
                                  shape=keys[:, 2], inputs=src[:, None], shared=self.shared[node.inputs[0]],
                                  ids_at=(0,))
                self.b.owner = None
                return ids
            return self.single(nid, w, view)
        raise TypeError(f"no lowering rule for {type(node).__name__}")


def lower_blocks(plan: Plan) -> CompactGraph:
    """The CompactGraph of a placed plan whose workers are machines (one core each)."""
    if plan.cluster.cores != 1:
        raise PlanError(f"lower_blocks lowers plans with one core per machine (see machine_plan), "
                        f"given {plan.cluster}")
    # lowering makes millions of small keys and tuples that it keeps, and almost no cycles: the
    # collector's passes over them cost a fifth of the time (Llama-7B at 32 machines), for nothing
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _lower_blocks(plan)
    finally:
        if collecting:
            gc.enable()


def _lower_blocks(plan: Plan) -> CompactGraph:
    g = plan.graph
    lw = _Lower(plan)
    live = g.live()
    outs = set(g.outputs.values())
    for nid, node in enumerate(g.nodes):
        if live[nid] and not (isinstance(node, Fill) and nid not in outs):  # fills are made where read
            held = lw.rule(nid, np.asarray(plan.where(nid), dtype=np.int64))
            remap = lw.b.finish()
            held.task = remap(held.task)
            if held.sig < 0:
                sig = (held.part, held.loc.shape, held.loc.tobytes(), held.kept)
                held.sig = lw.sigs.setdefault(sig, len(lw.sigs))
            lw.outs[nid] = held
        for u in lw.release_at.pop(nid, ()):
            lw.b.release(u)
            lw.fetched.pop(u, None)
    outputs = {}
    for name, nid in g.outputs.items():
        node, held = g.nodes[nid], lw.outs[nid]
        blocks = tuple(zip(held.task[:, 0].tolist(), held.part.boxes(), strict=True))
        outputs[name] = Output(node.shape, node.dtype, blocks)
    builder = lw.b
    del lw  # its caches and the nodes' blocks, before the arrays are joined: the peak of lowering
    return prefetch(replace(prune(builder.graph(outputs)), order=plan.order, stored=stored(g)))
