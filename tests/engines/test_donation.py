"""Buffer donation (engines/donation.py): a session run that replaces a resident input may
write ``where(c, x, old)`` into that input's block. Every result equals numpy's and the
reference engine's, and nothing another name, a feed or the driver holds is written."""

import ml_dtypes
import numpy as np
import pytest

import einsummable as es
from einsummable.ir.dtypes import to_numpy

B, N, D = 2, 6, 4


def cache_program(engine="local", dtype="f32", extra=None, workers=1):
    """``cache`` [B, N, D] takes ``new`` [B, D] at slot ``t`` each run (the KV cache's update);
    ``extra(g, cache, updated)`` adds outputs."""
    g = es.Graph()
    cache = g.input("cache", (B, N, D), dtype)
    new = g.input("new", (B, D), dtype)
    slot = g.ramp((1, N, 1), (0.0, 1.0, 0.0))
    updated = es.elementwise("where(x0 == t, x1, x2)", slot, new[:, None, :], cache).astype(dtype)
    g.output("cache", updated)
    g.output("total", updated.astype("f32").sum())
    if extra is not None:
        extra(g, cache, updated)
    return es.compile(g, workers=workers, engine=engine)


def start(dtype="f32"):
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((B, N, D)).astype(to_numpy(dtype))
    news = [rng.standard_normal((B, D)).astype(to_numpy(dtype)) for _ in range(N)]
    return cache, news


def block(sess, name):
    """The one block a resident tensor lies in (after the first run: what ``put`` left is an array)."""
    (array,) = sess.resident.tensors[name].blocks.values()
    return array


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_cache_update_writes_the_given_up_block_in_place(dtype):
    cache, news = start(dtype)
    sess = cache_program(dtype=dtype).session({"cache": cache})
    oracle = cache_program("reference", dtype).session({"cache": cache})
    want = cache.copy()
    for t, new in enumerate(news):
        before = block(sess, "cache") if t else None
        total = sess.run({"new": new, "t": t})["total"]
        assert t == 0 or block(sess, "cache") is before  # the slot is stored into the block itself
        want[:, t] = new
        np.testing.assert_array_equal(sess.state()["cache"], want)
        np.testing.assert_allclose(total, oracle.run({"new": new, "t": t})["total"], rtol=1e-5)
    np.testing.assert_array_equal(oracle.state()["cache"], want)


def test_without_a_session_no_feed_is_written():
    cache, news = start()
    kept = cache.copy()
    out = cache_program().run({"cache": cache, "new": news[0], "t": 2})
    np.testing.assert_array_equal(cache, kept)
    want = kept.copy()
    want[:, 2] = news[0]
    np.testing.assert_array_equal(out["cache"], want)


def test_arrays_handed_out_are_never_written_later():
    cache, news = start()
    sess = cache_program().session({"cache": cache})
    sess.run({"new": news[0], "t": 0})
    state, fetched = sess.state()["cache"], sess.run({"new": news[1], "t": 1}, fetch=["cache"])["cache"]
    copies = state.copy(), fetched.copy()
    sess.run({"new": news[2], "t": 2})
    sess.run({"new": news[3], "t": 1})
    np.testing.assert_array_equal(state, copies[0])
    np.testing.assert_array_equal(fetched, copies[1])
    np.testing.assert_array_equal(cache, start()[0])  # nor what the session was made from


def test_a_block_another_resident_name_holds_is_not_written():
    cache, news = start()
    # "old" keeps the input unchanged: the very block the update reads
    sess = cache_program(extra=lambda g, c, u: g.output("old", c)).session({"cache": cache}, keep=["old"])
    want = cache.copy()
    for t in range(3):
        sess.run({"new": news[t], "t": t})
        np.testing.assert_array_equal(sess.state()["old"], want)
        want[:, t] = news[t]
        np.testing.assert_array_equal(sess.state()["cache"], want)
    # "mirror" is the update itself under a second name: one block, two resident tensors,
    # then a second program updates "cache" alone
    mirror = cache_program(extra=lambda g, c, u: g.output("mirror", u))
    first = mirror.session({"cache": cache}, keep=["mirror"])
    first.run({"new": news[0], "t": 0})
    assert block(first, "mirror") is block(first, "cache")
    mirrored = first.state()["mirror"]
    second = cache_program().session(first)
    second.run({"new": news[1], "t": 1})
    np.testing.assert_array_equal(first.state()["mirror"], mirrored)
    mirrored[:, 1] = news[1]
    np.testing.assert_array_equal(first.state()["cache"], mirrored)


def test_an_input_another_task_reads_is_not_written():
    cache, news = start()
    prog = cache_program(extra=lambda g, c, u: g.output("before", (c * 2.0).sum()))
    sess = prog.session({"cache": cache})
    want = cache.copy()
    for t in range(3):
        out = sess.run({"new": news[t], "t": t})
        np.testing.assert_allclose(out["before"], 2 * want.sum(dtype=np.float64), rtol=1e-5)
        want[:, t] = news[t]
        np.testing.assert_array_equal(sess.state()["cache"], want)


def test_conditions_over_many_places_and_several_axes():
    """A condition spanning two axes (few places: one slab each) and one spanning the whole
    block (more places than MAX_SLABS: one masked store), against numpy."""
    from einsummable.engines import donation
    rng = np.random.default_rng(1)
    g = es.Graph()
    a = g.input("a", (8, 5, 6))
    x = g.input("x", (8, 6))
    rows, cols = g.ramp((8, 1, 1), (1.0, 0.0, 0.0)), g.ramp((1, 5, 1), (0.0, 1.0, 0.0))
    g.output("a", es.elementwise("where(x0 + x1 == t, x2 * 2.0, x3)", rows, cols, x[:, None, :], a))
    b = g.input("b", (8, 5, 6))
    m = g.input("m", (8, 5, 6))
    g.output("b", es.elementwise("where(x0 > 0.0, x0 * 3.0, x1)", m, b))
    sess = es.compile(g, workers=1).session({"a": rng.standard_normal((8, 5, 6), dtype=np.float32),
                                              "b": rng.standard_normal((8, 5, 6), dtype=np.float32)})
    want_a, want_b = sess.state()["a"], sess.state()["b"]
    stores = []
    spy = donation._store
    try:
        donation._store = lambda *args: stores.append(int(np.count_nonzero(args[1]))) or spy(*args)
        for t in range(4):
            xv = rng.standard_normal((8, 6), dtype=np.float32)
            mv = rng.standard_normal((8, 5, 6), dtype=np.float32)
            sess.run({"x": xv, "m": mv, "t": t})
            hit = (np.arange(8)[:, None] + np.arange(5)[None, :]) == t
            want_a = np.where(hit[:, :, None], xv[:, None, :] * 2, want_a)
            want_b = np.where(mv > 0, mv * np.float32(3.0), want_b)
            np.testing.assert_array_equal(sess.state()["a"], want_a)
            np.testing.assert_array_equal(sess.state()["b"], want_b)
    finally:
        donation._store = spy
    # both ran in place every run: the arrays ``session`` copied in are the session's own too
    assert len(stores) == 8 and max(stores) > donation.MAX_SLABS


def test_a_half_precision_update_rounds_as_the_plain_kernel():
    """bf16 cache, f32 values: the in-place store rounds as the join's own cast does."""
    rng = np.random.default_rng(2)
    g = es.Graph()
    cache = g.input("cache", (B, N, D), "bf16")
    new = g.input("new", (B, D))
    slot = g.ramp((1, N, 1), (0.0, 1.0, 0.0))
    updated = es.elementwise("where(x0 == t, x1 / 3.0, x2)", slot, new[:, None, :], cache)
    g.output("cache", updated.astype("bf16"))
    first = rng.standard_normal((B, N, D)).astype(ml_dtypes.bfloat16)
    sessions = [es.compile(g, workers=1, engine=e).session({"cache": first}) for e in ("local", "reference")]
    for t in range(N):
        feeds = {"new": rng.standard_normal((B, D), dtype=np.float32), "t": t}
        got, want = (s.run(feeds, fetch=["cache"])["cache"] for s in sessions)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_a_resident_view_of_a_feed_is_not_written():
    """A kept output that is a fed input unchanged lies in the driver's own array: updating it
    next run must not write there."""
    cache, news = start()
    g = es.Graph()
    g.output("cache", g.input("x", (B, N, D)))
    first = es.compile(g, workers=1).session({}, keep=["cache"])
    fed = cache.copy()
    first.run({"x": fed})
    second = cache_program().session(first)
    for t in range(2):
        second.run({"new": news[t], "t": t})
    np.testing.assert_array_equal(fed, cache)
    want = cache.copy()
    want[:, :2] = np.stack(news[:2], axis=1)
    np.testing.assert_array_equal(second.state()["cache"], want)
