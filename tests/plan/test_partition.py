import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from einsummable.errors import PlanError
from einsummable.ir.box import intersect, volume
from einsummable.plan.partition import Partition, split


@given(st.integers(1, 200), st.data())
def test_split_is_near_equal(n, data):
    k = data.draw(st.integers(1, n))
    b = split(n, k)
    sizes = [hi - lo for lo, hi in itertools.pairwise(b)]
    assert b[0] == 0 and b[-1] == n and len(sizes) == k
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_split_puts_larger_blocks_first():
    assert split(10, 3) == (0, 4, 7, 10)


@pytest.mark.parametrize("n,k", [(3, 4), (5, 0)])
def test_split_refuses_more_blocks_than_elements(n, k):
    with pytest.raises(PlanError, match="cannot cut"):
        split(n, k)


def test_partition_blocks_and_restriction():
    p = Partition.uniform((4, 6), (2, 3))
    assert p.counts == (2, 3) and p.num_blocks == 6
    assert p.box(4) == ((2, 4), (2, 4))
    assert list(p.boxes())[4] == p.box(4)
    assert p.restrict([1]).counts == (3,)
    assert p.flat(p.block_index(5)) == 5


@given(st.integers(1, 30), st.integers(1, 30), st.data())
def test_overlapping_covers_a_box_exactly(n, m, data):
    p = Partition.uniform((n, m), (data.draw(st.integers(1, n)), data.draw(st.integers(1, m))))
    lo0 = data.draw(st.integers(0, n - 1))
    lo1 = data.draw(st.integers(0, m - 1))
    box = ((lo0, data.draw(st.integers(lo0 + 1, n))), (lo1, data.draw(st.integers(lo1 + 1, m))))
    hits = p.overlapping(box)
    assert sum(volume(inter) for _, inter in hits) == volume(box)
    for q, inter in hits:
        assert intersect(p.box(q), box) == inter


def test_intersect_of_disjoint_boxes_is_none():
    assert intersect(((0, 2),), ((2, 4),)) is None
    assert intersect(((0, 3), (1, 5)), ((2, 4), (0, 2))) == ((2, 3), (1, 2))


def test_bad_boundaries_are_refused():
    with pytest.raises(PlanError, match="bad block boundaries"):
        Partition(((0, 3, 3, 5),))
