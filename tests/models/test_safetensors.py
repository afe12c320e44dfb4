"""Our safetensors reader against the ``safetensors`` library, on valid and hostile files.

Every hostile file below is one the library refuses; ours must refuse it too, with a
CheckpointError that names the file, never a raw Python error or a silent read.
"""

import json
import struct
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from einsummable.errors import CheckpointError
from einsummable.models.llama import safetensors_io

st = pytest.importorskip("safetensors.numpy")


def write(path, header, body=b""):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
    return path


def f32(lo, hi, shape=(2,), dtype="F32"):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [lo, hi]}


def raw(shape, offsets):
    """An entry with the shape and offsets as given, however wrong their types."""
    return {"dtype": "F32", "shape": shape, "data_offsets": offsets}


ENTRY = b'{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
HOSTILE = {  # name: (header, body, what our message must say)
    "negative offset reads another tensor": ({"a": f32(0, 8), "b": f32(-8, 0)}, bytes(8), "data_offsets"),
    "overlapping tensors": ({"a": f32(0, 8), "b": f32(4, 12)}, bytes(12), "overlaps"),
    "duplicate key, other bytes": (b'{"a":' + ENTRY + b',"a":' + ENTRY.replace(b"[0,8]", b"[8,16]") + b"}",
                                   bytes(16), "twice"),
    "negative dim": ({"a": f32(0, 8, (-1, 2))}, bytes(8), "shape"),
    "header is a list": (b"[1,2]", b"", "list"),
    "header is a string": (b'"abc"', b"", "str"),
    "header nested deeply": (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", "nested"),
    "gap between tensors": ({"a": f32(0, 8), "b": f32(12, 20)}, bytes(20), "unclaimed"),
    "offsets past the file": ({"a": f32(0, 16, (4,))}, bytes(8), "truncated"),
    "dtype and byte length disagree": ({"a": f32(0, 8, (3,))}, bytes(8), "needs 12 bytes"),
    "trailing bytes": ({"a": f32(0, 8)}, bytes(12), "trailing"),
    "unknown dtype": ({"a": f32(0, 8, (2,), "X99")}, bytes(8), "dtype"),
    "metadata not strings": ({"__metadata__": {"x": 1}, "a": f32(0, 8)}, bytes(8), "__metadata__"),
    "end before begin": ({"a": f32(8, 0, (0,))}, bytes(8), "data_offsets"),
    "bool in shape": ({"a": raw([True, 2], [0, 8])}, bytes(8), "shape"),
    "float offsets": ({"a": raw([2], [0.0, 8.0])}, bytes(8), "data_offsets"),
    "three offsets": ({"a": raw([2], [0, 8, 8])}, bytes(8), "data_offsets"),
    "missing field": ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), "malformed"),
    "entry not an object": ({"a": 5}, b"", "malformed"),
    "shape overflows": ({"a": f32(0, 8, (2**62, 2**62))}, bytes(8), "needs"),
    "header not UTF-8": (b'{"a\xff":1}', b"", "JSON"),
    "header not JSON": (b"not json at all!", b"", "JSON"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_refused_as_the_library_refuses_them(tmp_path, case):
    header, body, says = HOSTILE[case]
    path = write(tmp_path / "hostile.safetensors", header, body)
    with pytest.raises(Exception):  # noqa: B017 - the library's own error type varies by version
        st.load_file(path)
    with pytest.raises(CheckpointError, match=says) as err:
        safetensors_io.load(path)
    assert str(path) in str(err.value)


def test_header_size_past_the_file_or_the_limit(tmp_path):
    for n in (10**12, safetensors_io.MAX_HEADER + 1):
        path = tmp_path / "big.safetensors"
        path.write_bytes(struct.pack("<Q", n) + b"{}")
        with pytest.raises(Exception):  # noqa: B017
            st.load_file(path)
        with pytest.raises(CheckpointError, match="header claims"):
            safetensors_io.load(path)


def test_duplicate_identical_keys_are_refused_though_the_library_keeps_the_last(tmp_path):
    path = write(tmp_path / "dup.safetensors", b'{"a":' + ENTRY + b',"a":' + ENTRY + b"}", bytes(8))
    assert list(st.load_file(path)) == ["a"]
    with pytest.raises(CheckpointError, match="'a' twice"):
        safetensors_io.load(path)


@pytest.mark.parametrize("header,body", [
    ({}, b""),
    ({"__metadata__": {"format": "pt"}}, b""),
    ({"a": f32(0, 0, (0, 3)), "b": f32(0, 8)}, bytes(8)),                 # a zero-size tensor
    ({"a": f32(0, 8) | {"extra": 1}}, bytes(8)),                          # an unknown field
    (b'{"a":' + ENTRY + b"}    ", bytes(8)),                             # padded header
])
def test_odd_but_valid_files_load_as_the_library_loads_them(tmp_path, header, body):
    path = write(tmp_path / "odd.safetensors", header, body)
    ref = st.load_file(path)
    ours = safetensors_io.load(path)
    assert sorted(ours) == sorted(ref)
    for k, v in ref.items():
        assert ours[k].shape == v.shape and ours[k].dtype == v.dtype
        np.testing.assert_array_equal(ours[k], v)


def test_unaligned_and_mixed_dtypes_read_as_the_library_writes_them(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"h": rng.standard_normal(3).astype(np.float16),
              "f": rng.standard_normal((2, 5)).astype(np.float32),
              "i": rng.integers(-9, 9, 7).astype(np.int64), "b": rng.integers(0, 2, 5).astype(bool),
              "u": rng.integers(0, 200, 3).astype(np.uint8), "d": rng.standard_normal(()).astype(np.float64)}
    st.save_file(arrays, tmp_path / "x.safetensors")
    loaded = safetensors_io.load(tmp_path / "x.safetensors")
    for k, v in arrays.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape
        np.testing.assert_array_equal(loaded[k], v)


def test_bf16_reads_as_torch_writes_it(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    t = torch.randn(3, 5).to(torch.bfloat16)
    st_torch.save_file({"t": t}, tmp_path / "b.safetensors")
    loaded = safetensors_io.load(tmp_path / "b.safetensors")["t"]
    assert loaded.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(loaded.astype(np.float32), t.float().numpy())


def test_load_maps_the_file_instead_of_reading_it(tmp_path):
    """A 16 MB file loads with almost no heap allocation; the arrays are read-only views."""
    big = np.arange(4 << 20, dtype=np.float32).reshape(1024, 4096)
    safetensors_io.save({"w": big, "v": big[:2]}, tmp_path / "big.safetensors")
    tracemalloc.start()
    loaded = safetensors_io.load(tmp_path / "big.safetensors")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < big.nbytes / 16, peak
    np.testing.assert_array_equal(loaded["w"], big)
    assert not loaded["w"].flags.writeable
    with pytest.raises(ValueError):
        loaded["w"][0, 0] = 1.0


def test_saving_over_a_mapped_file_leaves_the_loaded_arrays_unchanged(tmp_path):
    path = tmp_path / "x.safetensors"
    safetensors_io.save({"w": np.ones(1000, np.float32)}, path)
    loaded = safetensors_io.load(path)
    safetensors_io.save({"w": np.zeros(1000, np.float32)}, path)
    np.testing.assert_array_equal(loaded["w"], 1.0)
    np.testing.assert_array_equal(safetensors_io.load(path)["w"], 0.0)


def test_a_device_is_not_read(tmp_path):
    """/dev/zero would read until memory runs out; a link to it is refused as well."""
    (tmp_path / "model.safetensors").symlink_to("/dev/zero")
    for path in ("/dev/zero", tmp_path / "model.safetensors"):
        with pytest.raises(CheckpointError, match="not a regular file"):
            safetensors_io.load(path)
