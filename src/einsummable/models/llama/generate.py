"""Text generation with a KV cache: one prefill program, then one decode program.

Prompts of different lengths are left-padded; the mask hides the pads and the
positions count from each row's first real token. The cache has a fixed length
(prompt + new tokens), so the decode program compiles once.

Resident (the default): the two programs share one session (``Program.session``),
so the weights and the cache stay on the workers. The prefill keeps its keys and
values as the cache, padded to its full length; each decode step writes its own
into the cache at column ``t`` (a run-time variable), ``where(slot == t, new, cache)``,
attends over the cache so updated (no copy of it into a longer one), and builds its
attention mask from ``t`` and the positions in the graph. The session gives the old
cache up to the step that replaces it, so the local engine stores the one slot into it
in place (engines/donation.py) rather than writing a whole new cache. A step
feeds the new ids and positions only (12 bytes a sequence) and fetches the sampled
ids (greedy, an argmax in the graph) or the logits. Both programs output the
weights unchanged, so each keeps them in its own partition: they move once, when
a program first reads them, not every step. A program whose plan cuts no node runs
on one local worker (see ``_compile``); any other, prefill or decode, runs on all the
workers or on one, whichever the planner's simulation predicts is faster.

``resident=False`` is the driver-fed path: every run feeds all the weights and
the cache from numpy arrays (the baseline the benchmark compares against).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

import einsummable.models.llama.model as llama
from einsummable.compile import Program, Session, compile
from einsummable.errors import EinsummableError, FeedError
from einsummable.frontend import builders
from einsummable.frontend.tensor import Graph, Tensor, elementwise
from einsummable.frontend.tensor_extras import argmax
from einsummable.hardware.cluster import Cluster
from einsummable.models.llama.lora import LoraConfig
from einsummable.models.llama.lora import shapes as lora_shapes
from einsummable.models.llama.model import LlamaConfig

NEG_INF = -np.inf


class Generator:
    """Runs a Llama for generation: ``Generator(cfg, params).generate([[1, 2, 3]], 10)``.

    ``session``: generate from the weights another session keeps resident (a
    ``Trainer``'s), bound by name, instead of from ``params``. ``lora``: the weights hold
    LoRA adapters of this config, and every projection adds them, as in training (a LoRA
    trainer's: ``Generator(cfg, session=trainer.session, lora=trainer.cfg.lora)``); weights
    that hold adapters without it are refused, not generated from as if the base alone.
    ``cluster``: plan for it (as ``compile``), e.g. the nodes of a Ray cluster with ``engine="ray"``.
    """

    def __init__(self, cfg: LlamaConfig, params: dict[str, np.ndarray] | None = None, *,
                 engine: str | None = None, workers: int | None = None, cluster: Cluster | None = None,
                 session: Session | None = None, resident: bool = True, lora: LoraConfig | None = None
                 ) -> None:
        if (params is None) == (session is None):
            raise EinsummableError("Generator takes the weights as params or as a session holding them, "
                                   "exactly one of the two")
        if session is not None and not resident:
            raise EinsummableError("a Generator bound to a session generates resident (resident=True)")
        self.cfg = cfg
        self.params = params
        held = params if params is not None else session.resident.tensors
        where = "params" if params is not None else "the session's resident state"
        adapters = sorted(n for n in held if n.endswith((".lora_A.weight", ".lora_B.weight")))
        if adapters and lora is None:
            raise EinsummableError(f"{where} hold(s) LoRA adapters ({adapters[0]}, ...): pass their config "
                                   "as lora= (a Trainer's: lora=trainer.cfg.lora) to generate with them, "
                                   "or merge them into the weights (lora.merge) first")
        self.lora = lora
        want = cfg.parameter_shapes() | (lora_shapes(cfg, lora) if lora is not None else {})
        missing = sorted(set(want) - set(held))
        if missing:
            raise EinsummableError(f"{where} lack(s) the weights {missing[:3]}"
                                   f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}")
        first = held["model.embed_tokens.weight"]
        self.dtype = "bf16" if str(first.dtype) in ("bfloat16", "bf16") else "f32"
        self.resident = resident
        self._options = {"engine": engine, "workers": workers, "cluster": cluster}
        self._programs: dict[tuple, Program] = {}
        self._root = session  # the shared resident state, once there is one
        self._sessions: dict[tuple, Session] = {}

    # ------------------------------------------------------------ programs

    @property
    def _lora_scale(self) -> float:
        return self.lora.scale if self.lora is not None else 1.0

    def _program(self, key: tuple) -> Program:
        """``key``: ("prefill", batch, tokens, cache length or 0, greedy), ("decode", batch, cache
        length, greedy), or the driver-fed path's ("fed", batch, tokens, cache length or 0)."""
        if key not in self._programs:
            kind, *shape = key
            graph = {"prefill": self._prefill_graph, "decode": self._decode_graph,
                     "fed": self._fed_graph}[kind]
            if kind == "fed" and key[3] and self._options["engine"] in (None, "local") \
                    and self._options["cluster"] is None:
                self._programs[key] = compile(graph(*shape), **(self._options | {"workers": 1}))
            else:
                self._programs[key] = self._compile(graph(*shape))
        return self._programs[key]

    def _compile(self, graph: Graph) -> Program:
        """On all the workers, or on one: one when the plan cuts no node (every block whole,
        so more workers only run whole nodes side by side, handing results between threads,
        while a lone worker's matrix products get all the cores), else whichever the
        simulation predicts is faster (a prefill at batch 8 whose plan cuts only the MLP
        ran 42-72 ms on 2 workers, 37-44 ms on one; a token is a chain of matrix-vector products).
        The alternative compiles once per program key, a fraction of a second."""
        prog = compile(graph, **self._options)
        # the plan's workers, not the taskgraph's: on Ray across machines it is built only on request
        planned = prog.plan.cluster if prog.plan is not None else None
        if planned is None or planned.workers == 1:
            return prog
        alone = compile(graph, **(self._options | {"workers": None, "cluster": planned.alone()}))
        if prog.engine == "local" and all(part.num_blocks == 1 for part in prog.plan.parts):
            return alone
        return alone if alone.simulate().makespan < prog.simulate().makespan else prog

    def _session(self, key: tuple) -> Session:
        if key not in self._sessions:
            prog = self._program(key)
            keep = [n for n in prog.graph.outputs if n.startswith("cache_")]
            if self._root is None:
                self._root = prog.session(self.params, keep)
                self._sessions[key] = self._root
            else:
                self._sessions[key] = prog.session(self._root, keep)
        return self._sessions[key]

    def _start(self, batch: int, new: int) -> tuple[Graph, dict[str, Tensor], Tensor, Tensor]:
        g = Graph()
        p = llama.parameters(g, self.cfg, self.dtype, self.lora)
        return g, p, g.input("ids", (batch, new), "i64"), g.input("pos", (batch, new))

    def _cache_inputs(self, g: Graph, batch: int, length: int) -> list[tuple[Tensor, Tensor]]:
        g_, j, k = self.cfg.num_key_value_heads, self.cfg.head_dim // 2, self.cfg.head_dim
        return [(g.input(f"cache_k{i}", (batch, length, g_, 2, j), self.dtype),
                 g.input(f"cache_v{i}", (batch, length, g_, k), self.dtype))
                for i in range(self.cfg.num_hidden_layers)]

    def _outputs(self, g: Graph, p: dict[str, Tensor], h: Tensor, greedy: bool) -> None:
        """The next ids (greedy) or the last logits, and the weights unchanged (kept where they lie)."""
        logits = llama.lm_head(self.cfg, p, h[:, -1:, :])[:, 0, :]
        if greedy:  # an i64, fed back as the next step's ids
            g.output("next", argmax(logits.astype("f32"), axis=-1))
        else:
            g.output("logits", logits)
        for name, w in p.items():
            g.output(name, w)

    def _prefill_graph(self, batch: int, n: int, length: int, greedy: bool) -> Graph:
        g, p, ids, pos = self._start(batch, n)
        h, new_cache = llama.decoder(self.cfg, p, ids, pos, g.input("mask", (batch, n, n)), None,
                                     lora_scale=self._lora_scale)
        self._outputs(g, p, h, greedy)
        for i, (k_new, v_new) in enumerate(new_cache if length else []):
            g.output(f"cache_k{i}", builders.pad(k_new, [(0, 0), (0, length - n)] + [(0, 0)] * 3))
            g.output(f"cache_v{i}", builders.pad(v_new, [(0, 0), (0, length - n), (0, 0), (0, 0)]))
        return g

    def _decode_graph(self, batch: int, length: int, greedy: bool) -> Graph:
        g, p, ids, pos = self._start(batch, 1)
        cache = self._cache_inputs(g, batch, length)
        column = g.ramp((1, length, 1, 1), (0.0, 1.0, 0.0, 0.0))  # f32: bf16 counts exactly to 256 only

        def write(cached: Tensor, new: Tensor) -> Tensor:
            """This step's keys or values into slot ``t``: the cache updated, attended over whole."""
            slot = column if cached.ndim == 4 else column[..., None]
            return elementwise("where(x0 == t, x1, x2)", slot, new, cached).astype(self.dtype)

        # a row sees its written slots [t - pos, t) (after its left pads) and slot t, this step's
        # own: one join, not a task per operator
        slots = g.ramp((1, 1, length), (0.0, 0.0, 1.0))
        mask = elementwise("where(x0 <= t, where(x0 >= t - x1, 0.0, -inf), -inf)", slots, pos[:, :, None])
        h, new_cache = llama.decoder(self.cfg, p, ids, pos, mask, cache, lora_scale=self._lora_scale,
                                     write=write)
        self._outputs(g, p, h, greedy)
        for i, (k, v) in enumerate(new_cache):
            g.output(f"cache_k{i}", k)
            g.output(f"cache_v{i}", v)
        return g

    def _fed_graph(self, batch: int, new: int, length: int) -> Graph:
        """The driver-fed path (the decode on one local worker): the mask and the whole cache
        are inputs, the new keys and values outputs."""
        g, p, ids, pos = self._start(batch, new)
        cache = self._cache_inputs(g, batch, length) if length else None
        mask = g.input("mask", (batch, new, length + new))
        h, new_cache = llama.decoder(self.cfg, p, ids, pos, mask, cache, lora_scale=self._lora_scale)
        g.output("logits", llama.lm_head(self.cfg, p, h[:, -1:, :])[:, 0, :])
        for i, (k_new, v_new) in enumerate(new_cache):
            g.output(f"k{i}", k_new)
            g.output(f"v{i}", v_new)
        return g

    # ------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, temperature: float = 0.0,
                 top_p: float = 1.0, stop_tokens: Sequence[int] = (), seed: int = 0,
                 use_cache: bool = True) -> list[list[int]]:
        """New tokens per prompt; greedy at temperature 0, else temperature/top-p sampling.

        A row stops after its first stop token (which it keeps) or after max_new_tokens.
        """
        max_new_tokens, temperature, top_p, stop_tokens, seed = check_sampling(
            max_new_tokens, temperature, top_p, stop_tokens, seed)
        tokens, pads = self._pad(prompts)
        rng = np.random.default_rng(seed)
        greedy = temperature <= 0
        batch, filled = tokens.shape
        length = filled + max(max_new_tokens - 1, 0) if use_cache else 0
        out: list[list[int]] = [[] for _ in prompts]
        done = np.zeros(len(prompts), dtype=bool)
        step = self._prefill(tokens, pads, length, greedy)
        cache = self._fed_cache(step, length) if use_cache and not self.resident else None
        for i in range(max_new_tokens):
            nxt = step["next"].astype(np.int64) if greedy else sample(step["logits"], temperature, top_p, rng)
            for b, t in enumerate(nxt):
                if not done[b]:
                    out[b].append(int(t))
                    done[b] = int(t) in stop_tokens
            if done.all() or i == max_new_tokens - 1:
                break
            if not use_cache:
                tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
                step = self._prefill(tokens, pads, 0, greedy)
            elif self.resident:
                feeds = {"ids": nxt[:, None].astype(np.int64),
                         "pos": (filled - pads)[:, None].astype(np.float32), "t": filled}
                step = self._session(("decode", batch, length, greedy)).run(feeds, fetch=[_fetched(greedy)])
            else:
                step = self._fed_decode(nxt, pads, cache, filled, greedy)
            filled += 1
        if self._root is not None:  # the cache is this call's alone: free it on the workers
            self._root.drop([n for n in self._root.resident.tensors if n.startswith("cache_")])
        return out

    def _pad(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise EinsummableError("generate needs at least one prompt, and no empty prompt")
        for p in prompts:
            bad = [t for t in p if not 0 <= t < self.cfg.vocab_size]
            if bad:
                raise EinsummableError(
                    f"prompt tokens {bad[:5]} are outside the vocabulary 0..{self.cfg.vocab_size - 1}"
                )
        n = max(len(p) for p in prompts)
        pads = np.array([n - len(p) for p in prompts])
        tokens = np.zeros((len(prompts), n), dtype=np.int64)
        for b, p in enumerate(prompts):
            tokens[b, pads[b] :] = p
        return tokens, pads

    def _prefill(self, tokens: np.ndarray, pads: np.ndarray, length: int,
                 greedy: bool) -> dict[str, np.ndarray]:
        """The first step's ids or logits; the prompt's keys and values become the cache (resident:
        padded to ``length`` and kept on the workers; fed: returned as "k0", "v0", ...)."""
        batch, n = tokens.shape
        q = np.arange(n)
        pos = q[None, :] - pads[:, None]
        allowed = (q[None, None, :] <= q[None, :, None]) & (q[None, None, :] >= pads[:, None, None])
        allowed |= np.eye(n, dtype=bool)[None]  # a pad row sees itself, so it stays finite
        feeds = _feeds(tokens, pos, allowed)
        if self.resident:
            return self._session(("prefill", batch, n, length, greedy)).run(feeds, fetch=[_fetched(greedy)])
        return _with_next(self._program(("fed", batch, n, 0)).run(self.params | feeds), greedy)

    def _fed_cache(self, out: dict[str, np.ndarray], length: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The prefill's keys and values copied into fixed-length cache buffers in numpy."""
        grown = []
        for i in range(self.cfg.num_hidden_layers):
            k, v = out[f"k{i}"], out[f"v{i}"]
            kk = np.zeros((k.shape[0], length, *k.shape[2:]), k.dtype)
            vv = np.zeros((v.shape[0], length, *v.shape[2:]), v.dtype)
            kk[:, : k.shape[1]], vv[:, : v.shape[1]] = k, v
            grown.append((kk, vv))
        return grown

    def _fed_decode(self, nxt: np.ndarray, pads: np.ndarray, cache: list, filled: int,
                    greedy: bool) -> dict[str, np.ndarray]:
        batch, length = len(nxt), cache[0][0].shape[1]
        slots = np.arange(length + 1)
        allowed = ((slots[None, :] < filled) & (slots[None, :] >= pads[:, None])) | (slots[None, :] == length)
        feeds = self.params | _feeds(nxt[:, None], (filled - pads)[:, None], allowed[:, None, :])
        for i, (k, v) in enumerate(cache):
            feeds[f"cache_k{i}"], feeds[f"cache_v{i}"] = k, v
        out = self._program(("fed", batch, 1, length)).run(feeds)
        for i, (k, v) in enumerate(cache):
            k[:, filled], v[:, filled] = out[f"k{i}"][:, 0], out[f"v{i}"][:, 0]
        return _with_next(out, greedy)


def check_sampling(max_new_tokens: object, temperature: object, top_p: object, stop_tokens: object,
                   seed: object) -> tuple[int, float, float, tuple[int, ...], int]:
    """The sampling arguments as Python numbers, checked once for every entry point
    (``Model.generate``, ``Generator.generate``, and through it the CLI's ``generate``): a
    FeedError names the argument, its value and what it accepts, rather than numpy failing
    later, or a value such as top_p 0 going unnoticed while decoding is greedy."""
    stops = stop_tokens.tolist() if isinstance(stop_tokens, np.ndarray) else stop_tokens
    checks = [
        ("max_new_tokens", max_new_tokens, "an integer >= 1",
         _is_int(max_new_tokens) and max_new_tokens >= 1),
        ("temperature", temperature, "a finite number >= 0", _is_real(temperature) and temperature >= 0),
        ("top_p", top_p, "a number in (0, 1]", _is_real(top_p) and 0 < top_p <= 1),
        ("stop_tokens", stop_tokens, "a list of token ids (integers >= 0)",
         isinstance(stops, Sequence) and not isinstance(stops, str | bytes)
         and all(_is_int(t) and t >= 0 for t in stops)),
        ("seed", seed, "an integer >= 0", _is_int(seed) and seed >= 0),
    ]
    for name, value, accepted, ok in checks:
        if not ok:
            raise FeedError(f"{name} must be {accepted}, got {value!r}")
    return int(max_new_tokens), float(temperature), float(top_p), tuple(int(t) for t in stops), int(seed)


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    number = isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)
    return number and math.isfinite(x)


def _fetched(greedy: bool) -> str:
    return "next" if greedy else "logits"


def _with_next(out: dict[str, np.ndarray], greedy: bool) -> dict[str, np.ndarray]:
    """The driver-fed path fetches the logits; greedy takes their argmax here."""
    return out | {"next": out["logits"].astype(np.float64).argmax(-1)} if greedy else out


def _feeds(ids: np.ndarray, pos: np.ndarray, allowed: np.ndarray) -> dict[str, np.ndarray]:
    mask = np.where(allowed, 0.0, NEG_INF).astype(np.float32)
    return {"ids": ids.astype(np.int64), "pos": pos.astype(np.float32), "mask": mask}


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> np.ndarray:
    """One token per row: argmax at temperature 0, else from the top-p nucleus."""
    logits = logits.astype(np.float64)
    if temperature <= 0:
        return logits.argmax(-1)
    z = logits / temperature
    probs = np.exp(z - z.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.empty(len(probs), dtype=np.int64)
    for b, row in enumerate(probs):
        order = np.argsort(-row, kind="stable")
        keep = np.cumsum(row[order]) - row[order] < top_p  # the smallest set whose mass reaches top_p
        kept = order[keep]
        out[b] = rng.choice(kept, p=row[kept] / row[kept].sum())
    return out
