"""Every ISA instruction against NumPy (exact where no reduction happens)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.kernels.nki_api import nki, nisa, nl

BF16 = ml_dtypes.bfloat16


def f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


@nki.jit
def matmul_kernel(a_t, b, out_dtype=nl.float32):
    """out[M, N] = a_t[K, M].T @ b[K, N], K in tiles of 128 accumulated in one PSUM tile."""
    k_total, m = a_t.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), dtype=out_dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for k0 in range(0, k_total, 128):
        kk = min(128, k_total - k0)
        at = nl.ndarray((kk, m), dtype=a_t.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((kk, n), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a_t[k0:k0 + kk, :])
        nisa.dma_copy(dst=bt, src=b[k0:k0 + kk, :])
        nisa.nc_matmul(dst=acc, stationary=at, moving=bt)
    sb = nl.ndarray((m, n), dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=acc)
    nisa.dma_copy(dst=out, src=sb)
    return out


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 300), m=st.integers(1, 128), n=st.integers(1, 512), seed=st.integers(0, 2**16))
def test_nc_matmul_bf16_accumulates_in_fp32(k: int, m: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    got = nki.simulate(matmul_kernel)(a, b)
    ref = f32(a).T.astype(np.float64) @ f32(b).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.float8_e4m3, ml_dtypes.float8_e5m2])
def test_nc_matmul_other_dtypes(rng: np.random.Generator, dtype: type) -> None:
    a = rng.standard_normal((64, 32)).astype(dtype)
    b = rng.standard_normal((64, 48)).astype(dtype)
    got = nki.simulate(matmul_kernel)(a, b)
    np.testing.assert_allclose(got, f32(a).T @ f32(b), rtol=1e-5, atol=1e-4)


def test_nc_matmul_bf16_result_is_rounded(rng: np.random.Generator) -> None:
    a = rng.standard_normal((128, 16)).astype(BF16)
    b = rng.standard_normal((128, 8)).astype(BF16)
    got = nki.simulate(matmul_kernel)(a, b, out_dtype=nl.bfloat16)
    assert got.dtype == np.dtype(BF16)
    np.testing.assert_array_equal(got, (f32(a).T @ f32(b)).astype(BF16))


@nki.jit
def matmul_accumulate_flag(a_t, b):
    """Two matmuls into one PSUM tile: accumulate=None then accumulate=False overwrites."""
    k, m = a_t.shape
    n = b.shape[1]
    out = nl.ndarray((2, m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    at = nl.ndarray((k, m), dtype=a_t.dtype, buffer=nl.sbuf)
    bt = nl.ndarray((k, n), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a_t)
    nisa.dma_copy(dst=bt, src=b)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    sb = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_matmul(dst=acc, stationary=at, moving=bt)
    nisa.nc_matmul(dst=acc, stationary=at, moving=bt, accumulate=True)
    nisa.tensor_copy(dst=sb, src=acc)
    nisa.dma_copy(dst=out[0], src=sb)
    nisa.nc_matmul(dst=acc, stationary=at, moving=bt, accumulate=False)
    nisa.tensor_copy(dst=sb, src=acc)
    nisa.dma_copy(dst=out[1], src=sb)
    return out


def test_nc_matmul_accumulate_flags(rng: np.random.Generator) -> None:
    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal((32, 24)).astype(np.float32)
    got = nki.simulate(matmul_accumulate_flag)(a, b)
    np.testing.assert_allclose(got[0], 2 * (a.T @ b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], a.T @ b, rtol=1e-5, atol=1e-5)


@nki.jit
def elementwise_kernel(x, y):
    """Returns (x + y, x * y, max(x, y), x - y, exp(2x + b), copy bf16, memset 3, tensor_scalar)."""
    p, f = x.shape
    xs = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    ys = nl.ndarray((p, f), dtype=y.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    nisa.dma_copy(dst=ys, src=y)
    outs = []
    for op in (nl.add, nl.multiply, nl.maximum, nl.subtract):
        t = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=xs, data2=ys, op=op)
        outs.append(t)
    bias = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=bias, value=0.5)
    act = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    red = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=act, op=nl.exp, data=xs, bias=bias, scale=2.0, reduce_op=nl.add, reduce_res=red)
    outs.append(act)
    cp = nl.ndarray((p, f), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=cp, src=xs)
    outs.append(cp)
    ms = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ms, value=3.0)
    outs.append(ms)
    ts = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ts, data=xs, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=bias)
    outs.append(ts)
    outs.append(red)
    results = []
    for t in outs:
        o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        results.append(o)
    return tuple(results)


def test_elementwise_ops_against_numpy(rng: np.random.Generator) -> None:
    x = rng.standard_normal((128, 40)).astype(np.float32)
    y = rng.standard_normal((128, 40)).astype(np.float32)
    add, mul, mx, sub, act, cp, ms, ts, red = nki.simulate(elementwise_kernel)(x, y)
    np.testing.assert_array_equal(add, x + y)
    np.testing.assert_array_equal(mul, x * y)
    np.testing.assert_array_equal(mx, np.maximum(x, y))
    np.testing.assert_array_equal(sub, x - y)
    np.testing.assert_allclose(act, np.exp(2 * x + 0.5), rtol=1e-6)
    np.testing.assert_allclose(red[:, 0], np.exp(2 * x + 0.5).sum(axis=1), rtol=1e-5)
    assert cp.dtype == np.dtype(BF16)
    np.testing.assert_array_equal(cp, x.astype(BF16))
    np.testing.assert_array_equal(ms, np.full_like(x, 3.0))
    np.testing.assert_allclose(ts, 3 * x + 0.5, rtol=1e-6)


@nki.jit
def creation_kernel():
    z = nl.zeros((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    o = nl.ones((4, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
    f = nl.full((4, 8), 7.0, dtype=nl.float32, buffer=nl.sbuf)
    oo = nl.ndarray((4, 8), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    ff = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=oo, src=o)
    nisa.dma_copy(dst=ff, src=f)
    return z, oo, ff


def test_creation() -> None:
    z, o, f = nki.simulate(creation_kernel)()
    assert (z == 0).all() and (f32(o) == 1).all() and (f == 7).all()


@nki.jit
def transpose_kernel(x):
    p, f = x.shape
    xs = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    tp = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=xs)
    sb = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=tp)
    out = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


def test_nc_transpose(rng: np.random.Generator) -> None:
    x = rng.standard_normal((96, 64)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate(transpose_kernel)(x), x.T)


@nki.jit
def strided_dma_kernel(x):
    """Copies column block 1 of x via a slice, and the same block via .ap()."""
    rows, cols = x.shape
    half = cols // 2
    a = nl.ndarray((rows, half), dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray((rows, half), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x[:, half:cols])
    nisa.dma_copy(dst=b, src=x.ap(pattern=[[cols, rows], [1, half]], offset=half))
    outs = []
    for t in (a, b):
        o = nl.ndarray((rows, half), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        outs.append(o)
    every_other = nl.ndarray((rows // 2, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=every_other, src=x[0:rows:2, :])
    return outs[0], outs[1], every_other


def test_dma_copy_slices_and_access_patterns(rng: np.random.Generator) -> None:
    x = rng.standard_normal((64, 32)).astype(BF16)
    a, b, e = nki.simulate(strided_dma_kernel)(x)
    np.testing.assert_array_equal(a, x[:, 16:])
    np.testing.assert_array_equal(b, x[:, 16:])
    np.testing.assert_array_equal(e, x[::2])


@nki.jit
def dma_converts(x):
    """FP32 SBUF tile -> BF16 HBM: the DMA converts through float32 ("nki.isa.dma_copy")."""
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_dma_copy_converts_dtypes() -> None:
    import ml_dtypes

    x = np.array([[1.0, 1.0 + 2 ** -9, 3.140625, -2.5]], np.float32)
    out = nki.simulate(dma_converts)(x)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, x.astype(ml_dtypes.bfloat16))


@nki.jit
def gather_rows_and_accumulate(table, idx):
    """Partition p reads row idx[p] of table (ap(vector_offset=...)); a second gather is
    added on top with dma_compute (gather read-modify-write)."""
    p, f = idx.shape[0], table.shape[1]
    ids = nl.ndarray((p, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ids, src=idx)
    rows = nl.ndarray((p, f), dtype=table.dtype, buffer=nl.sbuf)
    view = table.ap(pattern=[[f, p], [1, f]], vector_offset=ids, indirect_dim=0)
    nisa.dma_copy(dst=rows, src=view)
    nisa.dma_compute(dst=rows, srcs=[view, rows], reduce_op=nl.add)
    out = nl.ndarray((p, f), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=rows)
    return out


def test_vector_offset_gathers_rows_and_dma_compute_adds() -> None:
    table = np.arange(10 * 4, dtype=np.float32).reshape(10, 4)
    idx = np.array([[7], [0], [3], [7]], np.int32)
    np.testing.assert_array_equal(nki.simulate(gather_rows_and_accumulate)(table, idx), 2 * table[idx[:, 0]])
    with pytest.raises(Exception, match="vector_offset index 12 of partition 1 reaches outside"):
        nki.simulate(gather_rows_and_accumulate)(table, np.array([[1], [12], [0], [0]], np.int32))


class CountingLock:
    """A stand-in for the simulator's BLAS lock that counts how often it is taken."""

    def __init__(self) -> None:
        self.taken = 0

    def __enter__(self) -> None:
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        pass


@nki.jit
def nl_matmul_kernel(a_t, b):
    """out[M, N] = a_t[K, M].T @ b[K, N] through nl.matmul (one tile)."""
    at = nl.load(a_t)
    bt = nl.load(b)
    out = nl.ndarray((a_t.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(nl.matmul(at, bt, transpose_x=True)))
    return out


def test_every_product_takes_the_blas_lock(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    # more simulated cores than numpy's OpenBLAS has thread buffers for (64) abort the process when
    # they multiply at once; the lock keeps one product at a time
    from trnopt.kernels.sim import isa, tiles
    lock = CountingLock()
    monkeypatch.setattr(isa, "BLAS_LOCK", lock)
    monkeypatch.setattr(tiles, "BLAS_LOCK", lock)
    a = rng.standard_normal((256, 32)).astype(np.float32)
    b = rng.standard_normal((256, 48)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate(matmul_kernel)(a, b), a.T @ b, rtol=1e-5, atol=1e-4)
    assert lock.taken == 2     # one nc_matmul per 128-row K tile
    np.testing.assert_allclose(nki.simulate(nl_matmul_kernel)(a[:128], b[:128]), a[:128].T @ b[:128], rtol=1e-5,
                               atol=1e-4)
    assert lock.taken == 3
