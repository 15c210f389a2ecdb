"""Tensor views (slicing, .ap(), reshape, permute) against NumPy indexing, and dependency boxes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.kernels.sim import ConstraintError
from trnopt.kernels.sim.tensor import Allocation, MemoryRegion, NkiTensor, boxes_overlap


def tensor(shape: tuple[int, ...]) -> tuple[NkiTensor, np.ndarray]:
    a = Allocation(1, shape, np.float32, MemoryRegion.shared_hbm, "t", numerics=True)
    ref = np.arange(a.size, dtype=np.float32).reshape(shape)
    a.data[...] = ref.ravel()
    return NkiTensor(a), ref


@st.composite
def slicing(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple]:
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    key = []
    for n in shape:
        if draw(st.booleans()):
            key.append(draw(st.integers(0, n - 1)))
        else:
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            key.append(slice(start, stop, draw(st.integers(1, 3))))
    return shape, tuple(key)


@settings(max_examples=60, deadline=None)
@given(slicing())
def test_slicing_matches_numpy(case: tuple[tuple[int, ...], tuple]) -> None:
    shape, key = case
    t, ref = tensor(shape)
    v = t[key]
    np.testing.assert_array_equal(v.array(), ref[key])
    assert v.shape == ref[key].shape
    # the dependency box covers exactly the touched index range of every dim
    for d, (lo, hi) in enumerate(v.box()):
        k = key[d]
        if isinstance(k, int):
            assert (lo, hi) == (k, k + 1)
        else:
            idx = range(shape[d])[k]
            assert (lo, hi) == (idx[0], idx[-1] + 1)


@settings(max_examples=40, deadline=None)
@given(slicing(), slicing())
def test_slice_of_slice(case1: tuple, case2: tuple) -> None:
    shape, key = case1
    t, ref = tensor(shape)
    v, r = t[key], ref[key]
    if v.ndim == 0:
        return
    key2 = tuple(slice(0, n, 2) for n in v.shape)
    np.testing.assert_array_equal(v[key2].array(), r[key2])


def test_ap_reshape_permute() -> None:
    t, ref = tensor((8, 12))
    np.testing.assert_array_equal(t.ap(pattern=[[12, 8], [1, 6]], offset=6).array(), ref[:, 6:])
    np.testing.assert_array_equal(t.ap(pattern=[[1, 12], [12, 8]]).array(), ref.T)
    np.testing.assert_array_equal(t.reshape((4, 24)).array(), ref.reshape(4, 24))
    np.testing.assert_array_equal(t.permute((1, 0)).array(), ref.T)
    assert t.ap(pattern=[[12, 8], [1, 6]], offset=6).box() == ((0, 8), (6, 12))
    assert t.get_pattern() == [[12, 8], [1, 12]] and t.is_contiguous()


def test_bounds() -> None:
    t, _ = tensor((8, 12))
    for bad in (lambda: t[8], lambda: t[0:9], lambda: t[-1], lambda: t[:, 5:5], lambda: t[0, 0, 0],
                lambda: t.ap(pattern=[[12, 8], [1, 13]]), lambda: t.reshape((5, 5))):
        with pytest.raises(ConstraintError):
            bad()


def test_boxes_overlap() -> None:
    assert boxes_overlap(((0, 4), (0, 8)), ((3, 5), (7, 9)))
    assert not boxes_overlap(((0, 4), (0, 8)), ((0, 4), (8, 9)))


def test_ap_scalar_offset_moves_by_the_stride_of_the_indirect_dim() -> None:
    """Writing a [1, 8] row at row 2 of a [4, 8] tensor touches elements 16..23, not 2..9."""
    t, ref = tensor((4, 8))
    np.testing.assert_array_equal(t.ap([[8, 1], [1, 8]], scalar_offset=2, indirect_dim=0).array(), ref[2:3])
    np.testing.assert_array_equal(t.ap([[8, 1], [1, 2]], scalar_offset=3, indirect_dim=1).array(), ref[0:1, 3:5])
    with pytest.raises(ConstraintError, match="indirect_dim 2 out of range"):
        t.ap([[8, 1], [1, 8]], scalar_offset=1, indirect_dim=2)


def test_ap_offset_none_keeps_the_views_offset_and_own_dtype_is_accepted() -> None:
    t, ref = tensor((4, 8))
    v = t[1:3, :]
    np.testing.assert_array_equal(v.ap([[8, 2], [1, 8]]).array(), ref[1:3])
    np.testing.assert_array_equal(v.ap([[8, 2], [1, 8]], offset=None).array(), ref[1:3])
    np.testing.assert_array_equal(v.ap([[8, 1], [1, 8]], offset=8).array(), ref[2:3])
    np.testing.assert_array_equal(v.ap([[8, 2], [1, 8]], dtype=np.float32).array(), ref[1:3])
    # another dtype reinterprets the storage; offsets and strides count the new elements
    halves = t.ap([[16, 4], [1, 16]], dtype=np.uint16).array()
    np.testing.assert_array_equal(halves, ref.view(np.uint16).reshape(4, 16))
    np.testing.assert_array_equal(t[1:3, 2:6].view(np.uint16).array(), ref[1:3, 2:6].view(np.uint16))


def test_box_in_closed_form_equals_the_enumerated_box():
    """The no-carry shortcut of a view's dependency box gives the box of the enumerated
    elements, and declines (None) whenever some index would carry into the next dim."""
    import math

    from trnopt.kernels.sim.tensor import _box_without_carry

    def enumerated(shape, astrides, offset, pattern):
        idx = np.full((1,), offset, dtype=np.int64)
        for s, c in pattern:
            idx = (idx[:, None] + np.arange(c)[None, :] * s).ravel()
        return tuple((int(((idx // st) % n).min()), int(((idx // st) % n).max()) + 1)
                     for st, n in zip(astrides, shape))

    rng = np.random.default_rng(7)
    hits = declined = 0
    for _ in range(3000):
        shape = tuple(int(x) for x in rng.integers(1, 9, rng.integers(1, 4)))
        astrides = tuple(int(math.prod(shape[d + 1:])) for d in range(len(shape)))
        size = math.prod(shape)
        pattern = tuple((int(rng.integers(0, size)), int(rng.integers(1, 4))) for _ in range(rng.integers(1, 4)))
        offset = int(rng.integers(0, size))
        last = offset + sum(s * (c - 1) for s, c in pattern)
        if last >= size:
            continue
        got = _box_without_carry(shape, astrides, offset, pattern)
        if got is None:
            declined += 1
            continue
        hits += 1
        assert got == enumerated(shape, astrides, offset, pattern), (shape, offset, pattern)
    assert hits > 300 and declined > 100
    # a step that carries: 3 elements of stride 1 from column 3 of a 2 x 4 allocation
    assert _box_without_carry((2, 4), (4, 1), 3, ((1, 3),)) is None
    assert _box_without_carry((2, 4), (4, 1), 1, ((1, 3),)) == ((0, 1), (1, 4))
