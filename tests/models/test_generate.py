"""Resident generation: the weights and the KV cache stay on the workers; a decode step
feeds the new ids and positions alone and fetches the sampled ids."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import einsummable as es  # noqa: E402
from einsummable.compile import Program  # noqa: E402
from einsummable.engines.blocks import Blocks  # noqa: E402
from einsummable.hardware.cluster import Cluster  # noqa: E402
from einsummable.models.llama import weights  # noqa: E402
from einsummable.models.llama.generate import Generator  # noqa: E402
from einsummable.models.llama.model import LlamaConfig  # noqa: E402
from einsummable.train.trainer import TrainConfig, Trainer  # noqa: E402

PROMPTS = [[5, 6, 7, 8, 9], [9, 10], [3, 1, 4]]  # left-padded to 5
# A cluster on which the planner cuts the tiny model's nodes (slow cores, no overhead), so
# that its programs run on both workers; on the default one it cuts nothing.
CUTTING = Cluster(cores=2, min_block_seconds=0.0, flops_per_core=1e6, elementwise_flops_per_core=1e5,
                  task_overhead=0.0)


def hf_llama(tmp_path, heads=4, kv_heads=2, tied=False, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   tie_word_embeddings=tied, rms_norm_eps=1e-5, rope_theta=10000.0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "hf")
    return model, *weights.load(tmp_path / "hf")


def transformers_greedy(model, prompts, new):
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompts]


class FeedSpy:
    """Every run's arrays fed from the driver and arrays handed back to it, by name (bytes)."""

    def __init__(self, monkeypatch) -> None:
        self.runs: list[tuple[dict[str, int], dict[str, int], dict[str, float]]] = []
        execute = Program.execute

        def spy(prog, arrays, variables, carry=frozenset()):
            result = execute(prog, arrays, variables, carry)
            fed = {n: a.nbytes for n, a in arrays.items() if not isinstance(a, Blocks)}
            back = {n: a.nbytes for n, a in result.items() if not isinstance(a, Blocks)}
            self.runs.append((fed, back, dict(variables)))
            return result

        monkeypatch.setattr(Program, "execute", spy)

    def decode_steps(self):
        return [(fed, back) for fed, back, variables in self.runs if "t" in variables or "cache_k0" in fed]


@pytest.mark.parametrize("heads,kv_heads,tied", [(4, 2, False), (4, 4, True)])
@pytest.mark.parametrize("options", [{"workers": 2}, {"cluster": CUTTING}, {"workers": 1},
                                     {"engine": "reference"}], ids=["2", "cutting", "1", "reference"])
def test_resident_greedy_equals_the_fed_path_and_transformers(tmp_path, heads, kv_heads, tied, options):
    model, cfg, params = hf_llama(tmp_path, heads, kv_heads, tied)
    resident = Generator(cfg, params, **options).generate(PROMPTS, 7)
    fed = Generator(cfg, params, **options, resident=False).generate(PROMPTS, 7)
    assert resident == fed
    assert resident == transformers_greedy(model, PROMPTS, 7)


def test_resident_sampling_equals_the_fed_path(tmp_path):
    _, cfg, params = hf_llama(tmp_path)
    options = dict(temperature=0.9, top_p=0.8, seed=5)
    resident = Generator(cfg, params, cluster=CUTTING).generate(PROMPTS, 6, **options)
    assert resident == Generator(cfg, params, cluster=CUTTING, resident=False).generate(PROMPTS, 6, **options)


@pytest.mark.parametrize("where", [{"workers": 1}, {"cluster": CUTTING}], ids=["1", "cutting"])
def test_a_decode_step_feeds_only_ids_and_positions(tmp_path, monkeypatch, where):
    _, cfg, params = hf_llama(tmp_path)
    weight_bytes = sum(w.nbytes for w in params.values())
    spy = FeedSpy(monkeypatch)
    gen = Generator(cfg, params, **where)
    gen.generate(PROMPTS, 6)
    steps = spy.decode_steps()
    assert len(steps) == 5
    b = len(PROMPTS)
    for fed, back in steps:  # i64 ids and f32 positions, 12 bytes a sequence; back: the i64 ids
        assert fed == {"ids": 8 * b, "pos": 4 * b}
        assert back == {"next": 8 * b}
    spy.runs.clear()
    gen.generate(PROMPTS, 6)  # a second call reuses the weights where the first left them
    assert all(not any(n in params for n in fed) for fed, _, _ in spy.runs)
    assert not any(n.startswith("cache_") for n in gen._root.resident.tensors)  # the cache is freed
    spy.runs.clear()
    Generator(cfg, params, **where, resident=False).generate(PROMPTS, 6)
    before = spy.decode_steps()
    assert len(before) == 5 and all(sum(fed.values()) > weight_bytes for fed, _ in before)


def test_a_decode_step_writes_its_slot_into_the_cache_where_it_lies(tmp_path, monkeypatch):
    """The resident decode attends over its fixed-length cache, written at slot t in place: no
    node spans length + 1 keys (the cache copied into a longer one), and each step's cache
    block is the one the step before left, updated. The tokens are the driver-fed path's
    (which appends its keys to the cache) and transformers'."""
    model, cfg, params = hf_llama(tmp_path)
    gen = Generator(cfg, params, workers=1)
    steps = []
    execute = Program.execute

    def spy(prog, arrays, variables, carry=frozenset()):
        before = list(arrays["cache_v1"].blocks.values()) if "t" in variables else None
        result = execute(prog, arrays, variables, carry)  # (a given-up feed lets go of its blocks)
        if "t" in variables:
            steps.append([before, list(result["cache_v1"].blocks.values())])
        return result

    monkeypatch.setattr(Program, "execute", spy)
    got = gen.generate(PROMPTS, 6)
    assert got == Generator(cfg, params, workers=1, resident=False).generate(PROMPTS, 6)
    assert got == transformers_greedy(model, PROMPTS, 6)
    assert len(steps) == 5 and all(len(a) == len(b) == 1 and a[0] is b[0] for a, b in steps)
    (decode,) = [prog for key, prog in gen._programs.items() if key[0] == "decode"]
    length = decode.graph.nodes[decode.graph.outputs["cache_k0"]].shape[1]
    assert all(len(n.shape) < 2 or n.shape[1] != length + 1 for n in decode.graph.nodes)


def test_programs_whose_plan_cuts_nothing_run_on_one_worker(tmp_path):
    _, cfg, params = hf_llama(tmp_path)
    want = Generator(cfg, params, engine="reference").generate(PROMPTS, 4)
    for options, cut in (({"workers": 2}, False), ({"cluster": CUTTING}, True)):
        gen = Generator(cfg, params, **options)
        assert gen.generate(PROMPTS, 4) == want
        for prog in gen._programs.values():
            cuts = any(part.num_blocks > 1 for part in prog.plan.parts)
            assert cuts == cut and prog.taskgraph.workers == (2 if cut else 1)


def test_a_cutting_plan_runs_where_the_simulation_says_faster(tmp_path, monkeypatch):
    """The prefill as the decode: on all the workers or on one, whichever is predicted faster."""
    _, cfg, params = hf_llama(tmp_path)
    want = Generator(cfg, params, engine="reference").generate(PROMPTS, 4)
    simulate = Program.simulate
    for faster in (1, 2):
        def predicted(prog, *args, faster=faster, **kwargs):
            sim = simulate(prog, *args, **kwargs)
            return dataclasses.replace(sim, makespan=1.0 if prog.taskgraph.workers == faster else 2.0)

        monkeypatch.setattr(Program, "simulate", predicted)
        gen = Generator(cfg, params, cluster=CUTTING)
        assert gen.generate(PROMPTS, 4) == want
        workers = {key[0]: p.taskgraph.workers for key, p in gen._programs.items()}
        assert workers == {"prefill": faster, "decode": faster}


def test_a_batch_8_prefill_whose_plan_cuts_the_mlp_runs_on_one_worker():
    """The benchmark's model (23.5M parameters, prompt 16) at batch 8 on 2 workers: the plan cuts
    the MLP and leaves the rest whole, and ran 42-72 ms against 37-44 ms on one worker whose BLAS
    has both cores. The simulation must say so: it gave the one worker's GEMMs one core, and
    charged every input and view a kernel task's overhead."""
    cfg = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4)
    params = {n: np.zeros(s, np.float32) for n, s in cfg.parameter_shapes().items()}
    gen = Generator(cfg, params, workers=2)
    graph = gen._prefill_graph(8, 16, 47, True)
    two = es.compile(graph, workers=2)
    assert any(part.num_blocks > 1 for part in two.plan.parts)  # else the rule for whole plans decides
    assert gen._compile(graph).taskgraph.workers == 1


def test_generation_reads_a_training_sessions_weights_where_they_lie(tmp_path, monkeypatch):
    _, cfg, params = hf_llama(tmp_path)
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, 400)
    tcfg = TrainConfig(batch=2, seq=8, steps=4, warmup=1)
    trainer, twin = (Trainer(cfg, params, tcfg, data, workers=2) for _ in range(2))
    trainer.train_step()
    twin.train_step()
    want = Generator(cfg, trainer.params, engine="reference").generate(PROMPTS, 5)
    spy = FeedSpy(monkeypatch)
    gen = Generator(cfg, session=trainer.session, workers=2)
    assert gen.generate(PROMPTS, 5) == want
    assert spy.runs and all(set(fed) <= {"ids", "pos", "mask"} for fed, _, _ in spy.runs)
    # training goes on from the same resident weights, as if nothing had read them
    np.testing.assert_allclose(trainer.train_step(), twin.train_step(), rtol=1e-6)
    for name, w in twin.params.items():
        np.testing.assert_allclose(trainer.params[name], w, rtol=1e-6, atol=1e-7, err_msg=name)
    assert gen.generate(PROMPTS, 5) == Generator(cfg, twin.params, engine="reference").generate(PROMPTS, 5)


def test_generator_takes_params_or_a_session(tmp_path):
    _, cfg, params = hf_llama(tmp_path)
    first = Generator(cfg, params)
    first.generate([[1, 2]], 2)
    with pytest.raises(es.EinsummableError, match="exactly one"):
        Generator(cfg)
    with pytest.raises(es.EinsummableError, match="exactly one"):
        Generator(cfg, params, session=first._root)
    with pytest.raises(es.EinsummableError, match="resident"):
        Generator(cfg, session=first._root, resident=False)
    sess = es.compile(_square(), workers=1).session({"x": np.ones(3, np.float32)})
    with pytest.raises(es.EinsummableError, match=r"the session's resident state lack\(s\) the weights"):
        Generator(cfg, session=sess)


def _square():
    g = es.Graph()
    x = g.input("x", (3,))
    g.output("x", x * x)
    return g


@pytest.fixture(scope="module")
def ray_nodes():
    """Two raylets of 2 CPUs each, or the Ray the engine tests already started."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield
        return
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.ray
def test_resident_generation_on_ray_feeds_only_ids_and_positions(tmp_path, monkeypatch, ray_nodes):
    ray_engine = pytest.importorskip("einsummable.engines.ray")
    model, cfg, params = hf_llama(tmp_path)
    spy = FeedSpy(monkeypatch)
    gathered = []
    get = ray_engine.RayBlocks.get
    monkeypatch.setattr(ray_engine.RayBlocks, "get",
                        lambda self, box: gathered.append(self.name) or get(self, box))
    gen = Generator(cfg, params, engine="ray", cluster=es.Cluster(machines=2, cores=2))
    assert gen.generate(PROMPTS, 5) == transformers_greedy(model, PROMPTS, 5)
    steps = spy.decode_steps()
    assert len(steps) == 4
    for fed, back in steps:
        assert fed == {"ids": 8 * len(PROMPTS), "pos": 4 * len(PROMPTS)}
        assert back == {"next": 8 * len(PROMPTS)}
    assert gathered == []  # the decode read the prefill's weights and cache on the actors, not via the driver
    assert all(isinstance(w, ray_engine.RayBlocks) for w in gen._root.resident.tensors.values())
