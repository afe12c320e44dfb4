"""Loading a checkpoint peaks at the model's size plus about one tensor (issue 19 item 6): each
tensor is copied out of the memory map and its pages released (benchmarks/load_rss.py
measures a 1 GB one)."""

import subprocess
import sys

import numpy as np

from einsummable.models.llama import safetensors_io, weights
from einsummable.models.llama.model import LlamaConfig

PEAK = """
import sys
from pathlib import Path
from einsummable.models.llama import weights
def peak():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024
before = peak()
cfg, params = weights.load(Path(sys.argv[1]))
print(peak() - before)
"""


def test_a_load_peaks_at_the_model_plus_one_tensor_not_twice_the_model(tmp_path):
    cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s, dtype=np.float32) for n, s in cfg.parameter_shapes().items()}
    weights.save(tmp_path, cfg, params)
    size = (tmp_path / "model.safetensors").stat().st_size
    largest = max(w.nbytes for w in params.values())
    assert largest < 0.15 * size
    done = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path)], capture_output=True, text=True,
                          check=True)
    peak = int(done.stdout)
    assert peak < size + 2 * largest, (peak / size, largest / size)  # kept resident it was 2 x size
    loaded = weights.load(tmp_path)[1]
    for name, w in params.items():
        np.testing.assert_array_equal(loaded[name], w, err_msg=name)


def test_a_released_tensor_still_reads_its_values(tmp_path):
    a = np.arange(5000, dtype=np.float32).reshape(50, 100)
    safetensors_io.save({"a": a, "b": a + 1}, tmp_path / "x.safetensors")
    tensors = safetensors_io.load(tmp_path / "x.safetensors")
    total = float(tensors["a"].sum())
    safetensors_io.release(tensors["a"])
    safetensors_io.release(np.ones(3))  # not a map: left alone
    assert float(tensors["a"].sum()) == total  # the pages come back from the page cache
    np.testing.assert_array_equal(tensors["b"], a + 1)
