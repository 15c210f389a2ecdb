"""Pre-0.6 instructions on runtime addresses (nisa.tensor_copy_dynamic_src, nl.atomic_rmw,
nisa.local_gather), FP8 double-row matmuls, sequence_bounds padding, stores that move
unwritten elements along, and PSUM beyond its 8 banks spilled as the compiler does, each
against NumPy on inputs the API reference's examples do not use (shuffled offsets, repeated
rows, different indices per GpSimd core)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from trnopt.kernels.sim import ConstraintError, UninitializedReadError


def test_tensor_copy_dynamic_src_reads_offsets_from_an_sbuf_tile(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def pick(src, offsets):  # src [128, 256]; offsets [1, 16], each the start of a 2-column window
        out = nl.ndarray((128, 16, 2), dtype=src.dtype, buffer=nl.shared_hbm)
        s, o = nl.load(src), nl.load(offsets)
        buf = nl.ndarray((nl.par_dim(128), 16, 2), dtype=src.dtype, buffer=nl.sbuf)
        ix, _, iy = nl.mgrid[0:128, 0:1, 0:2]
        for i in nl.affine_range(16):
            buf[ix, i, iy] = nisa.tensor_copy_dynamic_src(s[ix, o[0, i] + iy])
        nl.store(out, value=buf)
        return out

    rng = np.random.default_rng(7)
    src = rng.standard_normal((128, 256), dtype=np.float32)
    offsets = rng.permutation(255)[:16].astype(np.int32).reshape(1, 16)
    want = np.stack([src[:, offsets[0, i]:offsets[0, i] + 2] for i in range(16)], axis=1)
    np.testing.assert_array_equal(nki.simulate_kernel(pick, src, offsets), want)


def test_tensor_copy_dynamic_src_past_the_tile_is_refused(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def past(src, offsets):
        out = nl.ndarray((128, 2), dtype=src.dtype, buffer=nl.shared_hbm)
        s, o = nl.load(src), nl.load(offsets)
        ix, iy = nl.mgrid[0:128, 0:2]
        nl.store(out, value=nisa.tensor_copy_dynamic_src(s[ix, o[0, 0] + iy]))
        return out

    with pytest.raises(ConstraintError, match=r"index \[63, 64\] out of bounds for dim 1 of size 64"):
        nki.simulate_kernel(past, np.zeros((128, 64), np.float32), np.array([[63]], np.int32))


def test_atomic_rmw_adds_into_shuffled_and_repeated_rows(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def scatter_add(table, idx, val):  # table [64, 32]; idx [128, 1] row per partition; val [128, 32]
        out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(table))
        ix = nl.arange(32)[None, :]
        nl.atomic_rmw(out[nl.load(idx), ix], value=nl.load(val), op=np.add)
        return out

    rng = np.random.default_rng(8)
    table = rng.standard_normal((64, 32), dtype=np.float32)
    idx = rng.integers(0, 64, size=(128, 1), dtype=np.int32)  # 128 rows into 64: repeats
    val = rng.standard_normal((128, 32), dtype=np.float32)
    want = table.copy()
    np.add.at(want, idx[:, 0], val)
    np.testing.assert_allclose(nki.simulate_kernel(scatter_add, table, idx, val), want, rtol=1e-5, atol=1e-5)


def test_atomic_rmw_takes_only_add(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def scatter_mul(table, idx, val):
        out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(table))
        nl.atomic_rmw(out[nl.load(idx), nl.arange(8)[None, :]], value=nl.load(val), op=np.multiply)
        return out

    with pytest.raises(ConstraintError, match="op must be np.add"):
        nki.simulate_kernel(scatter_mul, np.ones((4, 8), np.float32), np.zeros((4, 1), np.int32),
                            np.ones((4, 8), np.float32))


def _local_gather_reference(src, index, n, valid):
    """Core c of partitions [16c, 16c + 16): indices flattened partition first, the first
    ``valid``; each partition copies n elements from each index (an element offset)."""
    flat = src.reshape(src.shape[0], -1)
    out = np.empty((src.shape[0], valid, n), src.dtype)
    for lo in range(0, src.shape[0], 16):
        for j, i in enumerate(index[lo:lo + 16].T.reshape(-1)[:valid]):
            out[lo:lo + 16, j] = flat[lo:lo + 16, int(i):int(i) + n]
    return out


def test_local_gather_per_core_indices(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def gather(src, index):
        out = nl.ndarray((64, 20, 2), dtype=src.dtype, buffer=nl.shared_hbm)
        nl.store(out, nisa.local_gather(nl.load(src), nl.load(index), num_elem_per_idx=2, num_valid_indices=20))
        return out

    rng = np.random.default_rng(9)
    src = rng.standard_normal((64, 100), dtype=np.float32)
    index = rng.integers(0, 99, size=(64, 2), dtype=np.uint16)  # a different slice per core, 32 per core
    np.testing.assert_array_equal(nki.simulate_kernel(gather, src, index), _local_gather_reference(src, index, 2, 20))


def test_local_gather_rules(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def gather(src, index, n):
        out = nl.ndarray((32, 4 * n), dtype=src.dtype, buffer=nl.shared_hbm)
        nl.store(out, nisa.local_gather(nl.load(src), nl.load(index), num_elem_per_idx=n))
        return out

    src = np.zeros((32, 16), np.float32)
    with pytest.raises(ConstraintError, match="index must be uint16"):
        nki.simulate_kernel(gather, src, np.zeros((32, 2), np.int32), 1)
    with pytest.raises(ConstraintError, match=r"num_elem_per_idx must be one of \(1, 2, 4, 8, 16, 32\), got 3"):
        nki.simulate_kernel(gather, src, np.zeros((32, 2), np.uint16), 3)
    with pytest.raises(ConstraintError, match="reads past the 16 elements of a partition"):
        nki.simulate_kernel(gather, src, np.full((32, 2), 15, np.uint16), 2)


def test_psum_tiles_all_live_spill_and_match(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def all_then_reduce(a, b):  # 12 PSUM tiles of a bank each, all written before any is read
        out = nl.ndarray((12, 128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((12, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        b_sb = nl.load(b)
        for i in nl.affine_range(12):
            ps[i] = nisa.nc_matmul(nl.load(a[:, i * 128:(i + 1) * 128]), b_sb)
        for i in nl.affine_range(12):
            nl.store(out[i], value=nisa.tensor_reduce(op=nl.max, data=ps[i], axis=1, keepdims=True))
        return out

    rng = np.random.default_rng(10)
    a, b = rng.standard_normal((128, 1536), dtype=np.float32), rng.standard_normal((128, 512), dtype=np.float32)
    want = np.stack([(a[:, i * 128:(i + 1) * 128].T @ b).max(axis=1, keepdims=True) for i in range(12)])
    np.testing.assert_allclose(nki.simulate_kernel(all_then_reduce, a, b), want, rtol=1e-4, atol=1e-3)


def test_double_row_matmul_contracts_over_the_row_pair(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def mm(a, b):  # a [128, 2, 64], b [128, 2, 512], FP8
        out = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.nc_matmul(nl.load(a), nl.load(b), perf_mode="double_row_gen3"))
        return out

    rng = np.random.default_rng(11)
    a = rng.uniform(-2, 2, (128, 2, 64)).astype(ml_dtypes.float8_e5m2)
    b = rng.uniform(-2, 2, (128, 2, 512)).astype(ml_dtypes.float8_e5m2)
    want = np.einsum("kli,klj->ij", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(nki.simulate_kernel(mm, a, b), want, rtol=1e-5, atol=1e-4)
    with pytest.raises(ConstraintError, match=r"double_row takes FP8 operands"):
        nki.simulate_kernel(mm, a.astype(np.float32), b.astype(np.float32))


def test_store_moves_unwritten_elements_along(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def half(a):  # only the left half of the tile is written; the whole tile is stored
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        ix, iy = nl.mgrid[0:128, 0:64]
        t[ix, iy] = nl.exp(nl.load(a[ix, iy]), mask=(iy < 32))
        nl.store(out, value=t)
        return out

    @nki.jit
    def nothing(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf))
        return out

    a = np.random.default_rng(12).standard_normal((128, 64), dtype=np.float32)
    got = nki.simulate_kernel(half, a)
    np.testing.assert_allclose(got[:, :32], np.exp(a[:, :32]), rtol=1e-5)
    assert np.isnan(got[:, 32:]).all()  # the device would hold whatever the SBUF held
    with pytest.raises(UninitializedReadError, match="nl.store: value reads 8192 of 8192 elements"):
        nki.simulate_kernel(nothing, a)


def test_sequence_bounds_pads_segment_zero(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def bounds(ids):
        out = nl.ndarray((1, 2, ids.shape[1]), dtype=ids.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.sequence_bounds(segment_ids=nl.load(ids)))
        return out

    ids = np.array([[0, 0, 3, 3, 3, 5, 0, 7, 7, 9]], np.float32)  # id 0 pads: start n, end -1
    want = np.array([[[10, 10, 2, 2, 2, 5, 10, 7, 7, 9], [-1, -1, 5, 5, 5, 6, -1, 9, 9, 10]]], np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(bounds, ids), want)
