"""quantize_mx and nc_matmul_mx ("nki.isa.quantize_mx", "nki.isa.nc_matmul_mx") against NumPy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from trnopt.kernels.sim import run_ranks
from trnopt.kernels.sim import isa as nisa
from trnopt.kernels.sim import language as nl
from trnopt.kernels.sim import nki
from trnopt.kernels.sim.errors import ConstraintError

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


@nki.jit
def quantize_kernel(x, scale_partitions=None):
    """x [P, F] bf16 -> (the MX bytes [P, F] as uint8, the used scale rows [P // 8, F // 4]);
    ``scale_partitions`` (default P) sizes the scale tile."""
    p, f = x.shape
    xs = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    q = nl.ndarray((p, f // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    sc = nl.ndarray((scale_partitions or p, f // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=xs, dst_scale=sc)
    out_q = nl.ndarray((p, f), dtype=nl.uint8, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_q, src=q.view(nl.uint8))
    out_s = nl.ndarray((p // 8, f // 4), dtype=nl.uint8, buffer=nl.shared_hbm)
    for quad in range(p // 32):  # 4 scale partitions at the top of each quadrant
        nisa.dma_copy(dst=out_s[4 * quad:4 * quad + 4, :], src=sc[32 * quad:32 * quad + 4, :])
    return out_q, out_s


def test_quantize_mx_scales_and_data_per_8x4_group():
    rng = np.random.default_rng(0)
    p, f = 64, 32
    mags = np.exp2(rng.integers(-6, 6, (p // 8, f // 4)))  # one magnitude per 8 x 4 group
    x = (rng.standard_normal((p // 8, 8, f // 4, 4)) * mags[:, None, :, None]).reshape(p, f).astype(BF16)
    res = run_ranks(quantize_kernel, [(x,)])
    q, s = res.outputs[0]
    groups = x.astype(np.float32).reshape(p // 8, 8, f // 4, 4)
    amax = np.abs(groups).max(axis=(1, 3))
    exp = np.floor(np.log2(amax)) - 8 + 1  # twice the OCP scale: emax(E4M3FN) = 8
    assert np.array_equal(s.astype(np.int64), (exp + 127).astype(np.int64))
    want = (groups / np.exp2(exp)[:, None, :, None]).reshape(p, f).astype(E4M3)
    assert np.array_equal(q.view(E4M3).astype(np.float32), want.astype(np.float32))
    # the largest value of each group lands in [256, 512) / 2, inside E4M3FN's 448
    assert np.abs(q.view(E4M3).astype(np.float32)).max() <= 448


@nki.jit
def mx_matmul_kernel(a, b):
    """Quantize a [K, 4M] and b [K, 4N] (bf16) to MX and multiply: out [M, N] float32."""
    k, fa = a.shape
    fb = b.shape[1]
    tiles = []
    for src, f in ((a, fa), (b, fb)):
        s = nl.ndarray((k, f), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=src)
        q = nl.ndarray((k, f // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        sc = nl.ndarray((k, f // 4), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=q, src=s, dst_scale=sc)
        tiles.append((q, sc))
    acc = nl.ndarray((fa // 4, fb // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=tiles[0][0], moving=tiles[1][0], stationary_scale=tiles[0][1],
                      moving_scale=tiles[1][1])
    nisa.nc_matmul_mx(dst=acc, stationary=tiles[0][0], moving=tiles[1][0], stationary_scale=tiles[0][1],
                      moving_scale=tiles[1][1])  # accumulates (accumulate=None on written PSUM)
    sb = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=acc)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


@pytest.mark.parametrize("k", [32, 128])
def test_nc_matmul_mx_contracts_partitions_and_the_four_packed_values(k):
    """Small integers quantize exactly, so the MX product equals the exact one:
    out[m, n] = 2 * sum_{p, j} a[p, 4m + j] * b[p, 4n + j]."""
    rng = np.random.default_rng(k)
    m, n = 16, 64
    a = rng.integers(-8, 9, (k, 4 * m)).astype(BF16)
    b = rng.integers(-8, 9, (k, 4 * n)).astype(BF16)
    got = run_ranks(mx_matmul_kernel, [(a, b)]).outputs[0]
    want = 2 * np.einsum("pmj,pnj->mn", a.astype(np.float64).reshape(k, m, 4), b.astype(np.float64).reshape(k, n, 4))
    assert np.array_equal(got, want)


@nki.jit
def fp4_matmul_kernel(a_bits, b_bits, a_scale, b_scale):
    """Host-packed MX operands: a float8_e4m3fn_x4 [K, M], b float4_e2m1fn_x4 [K, N]."""
    k, m = a_bits.shape
    n = b_bits.shape[1]
    at = nl.ndarray((k, m), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    bt = nl.ndarray((k, n), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
    nisa.dma_copy(dst=at, src=a_bits)
    nisa.dma_copy(dst=bt, src=b_bits)
    sa = nl.ndarray((k, m), dtype=nl.uint8, buffer=nl.sbuf)
    sb_ = nl.ndarray((k, n), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a_scale)
    nisa.dma_copy(dst=sb_, src=b_scale)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=at, moving=bt, stationary_scale=sa, moving_scale=sb_)
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_nc_matmul_mx_fp4_nibbles_and_quadrant_scales():
    """FP4 E2M1 nibbles (value j in bits 4j..4j+3, OCP MX table) and scales read from partition
    32 * (p // 32) + (p % 32) // 8 of the scale tile."""
    rng = np.random.default_rng(3)
    k, m, n = 64, 8, 16
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    a_vals = rng.integers(-4, 5, (k, m, 4)).astype(np.float32)
    a_bits = np.ascontiguousarray(a_vals.astype(E4M3)).view(np.uint8).reshape(k, m, 4).view("<u4")[..., 0]
    nib = rng.integers(0, 16, (k, n, 4)).astype(np.uint16)
    b_bits = (nib << (4 * np.arange(4, dtype=np.uint16))).sum(-1).astype(np.uint16)
    a_scale = np.full((k, m), 255, np.uint8)  # rows no group uses hold NaN scales
    b_scale = np.full((k, n), 255, np.uint8)
    rows = 32 * (np.arange(k) // 32) + (np.arange(k) % 32) // 8
    ea = rng.integers(-3, 4, (k // 8, m))
    eb = rng.integers(-3, 4, (k // 8, n))
    a_scale[np.unique(rows)] = ea + 127
    b_scale[np.unique(rows)] = eb + 127
    args = (a_bits.astype(np.uint32).view(nl.float8_e4m3fn_x4), b_bits.view(nl.float4_e2m1fn_x4), a_scale, b_scale)
    got = run_ranks(fp4_matmul_kernel, [args]).outputs[0]
    g = np.arange(k) // 8
    a = a_vals * np.exp2(ea[g])[:, :, None]
    b = e2m1[nib] * np.exp2(eb[g])[:, :, None]
    assert np.allclose(got, np.einsum("pmj,pnj->mn", a, b), rtol=1e-6, atol=1e-6)


def test_quantize_mx_refuses_a_scale_tile_outside_the_quadrants():
    with pytest.raises(ConstraintError, match="dst_scale"):  # 64 // 8 partitions: too short past 32
        run_ranks(quantize_kernel, [(np.ones((64, 16), BF16),)], kwargs=dict(scale_partitions=8))


@nki.jit
def wide_mx_kernel(a_bits, b_bits, a_scale, b_scale, dst_dtype):
    """One nc_matmul_mx with a moving free size past one PSUM bank: [M, N] in dst_dtype."""
    k, m = a_bits.shape
    n = b_bits.shape[1]
    ops = []
    for src, dt in ((a_bits, nl.float8_e4m3fn_x4), (b_bits, nl.float8_e4m3fn_x4), (a_scale, nl.uint8),
                    (b_scale, nl.uint8)):
        t = nl.ndarray(src.shape, dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        ops.append(t)
    acc = nl.ndarray((m, n), dtype=dst_dtype, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=ops[0], moving=ops[1], stationary_scale=ops[2], moving_scale=ops[3])
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def _fp8_x4_operands(rng, k, f, top=4):
    vals = rng.integers(-top, top + 1, (k, f, 4)).astype(np.float32)
    bits = np.ascontiguousarray(vals.astype(E4M3)).view(np.uint8).reshape(k, f, 4).view("<u4")[..., 0]
    return bits.astype(np.uint32).view(nl.float8_e4m3fn_x4), vals


@pytest.mark.parametrize("dst_dtype,n", [(nl.bfloat16, 1024), (nl.float32, 1024)])
def test_nc_matmul_mx_moving_free_size_may_span_psum_banks(dst_dtype, n):
    """The moving free size may reach 4096 (float32 dst) or 8192 (bfloat16 dst), the whole
    PSUM, not only one 512-element bank as nc_matmul's ("nki.isa.nc_matmul_mx", Tile size)."""
    rng = np.random.default_rng(5)
    k, m = 32, 8
    a_bits, a = _fp8_x4_operands(rng, k, m, 1)
    b_bits, b = _fp8_x4_operands(rng, k, n, 1)
    scales = (np.full((k, m), 127, np.uint8), np.full((k, n), 127, np.uint8))  # 2 ** 0
    got = run_ranks(wide_mx_kernel, [(a_bits, b_bits) + scales], kwargs={"dst_dtype": dst_dtype}).outputs[0]
    want = np.einsum("pmj,pnj->mn", a, b)  # integer sums of at most 128: exact in bfloat16
    assert np.array_equal(got, want)


@pytest.mark.parametrize("k,m,match", [(48, 8, "multiple of 32"), (128, 7, "even")])
def test_nc_matmul_mx_refuses_partitions_off_32_and_odd_stationary_free_size(k, m, match):
    """Partitions a multiple of 32 up to 128; the stationary free size even, at most 128
    ("nki.isa.nc_matmul_mx", Tile size)."""
    rng = np.random.default_rng(6)
    a_bits, _ = _fp8_x4_operands(rng, k, m)
    b_bits, _ = _fp8_x4_operands(rng, k, 16)
    scales = (np.full((k, m), 127, np.uint8), np.full((k, 16), 127, np.uint8))
    with pytest.raises(ConstraintError, match=match):
        run_ranks(wide_mx_kernel, [(a_bits, b_bits) + scales], kwargs={"dst_dtype": nl.float32})
