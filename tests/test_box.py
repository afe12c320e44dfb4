"""Box geometry against numpy masks: what a box covers is the cells its slices select."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from einsummable.ir.box import box_shape, fmt_box, intersect, place, shift, slices, volume, whole, within

SHAPE = (5, 4, 3)


@st.composite
def boxes(draw):
    out = []
    for n in SHAPE:
        lo = draw(st.integers(0, n))
        out.append((lo, draw(st.integers(lo, n))))
    return tuple(out)


def _mask(box) -> np.ndarray:
    m = np.zeros(SHAPE, dtype=bool)
    m[slices(box)] = True
    return m


@given(boxes(), boxes())
def test_intersect_covers_exactly_the_common_cells(a, b):
    common = _mask(a) & _mask(b)
    meet = intersect(a, b)
    if meet is None:
        assert not common.any()
    else:
        assert (_mask(meet) == common).all() and volume(meet) == common.sum()


@given(boxes(), boxes())
def test_within_reads_the_same_cells_from_the_block(a, b):
    meet = intersect(a, b)
    if meet is None:
        return
    x = np.arange(np.prod(SHAPE)).reshape(SHAPE)
    np.testing.assert_array_equal(x[slices(b)][slices(within(meet, b))], x[slices(meet)])
    np.testing.assert_array_equal(x[slices(a)][slices(shift(meet, [lo for lo, _ in a]))], x[slices(meet)])


@given(boxes(), st.tuples(*(st.integers(0, 3) for _ in SHAPE)))
def test_place_is_the_box_of_that_shape_at_that_corner(a, corner):
    placed = place(box_shape(a), corner)
    assert box_shape(placed) == box_shape(a) and [lo for lo, _ in placed] == list(corner)


def test_whole_selects_everything_and_prints_as_slices():
    x = np.ones(SHAPE)
    assert x[slices(whole(SHAPE))].shape == SHAPE and volume(whole(SHAPE)) == x.size
    assert fmt_box(((0, 4), (2, 3))) == "[0:4,2:3]" and fmt_box(()) == "[]"
