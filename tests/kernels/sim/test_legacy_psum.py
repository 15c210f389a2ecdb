"""Pre-0.6 PSUM use the tutorials rely on: ``acc += nc_matmul(...)`` onto a fresh PSUM tile
(the accumulation group's first matmul writes), and a PSUM tensor with block dims larger
than PSUM whose blocks are live one at a time. Each against NumPy."""

from __future__ import annotations

import numpy as np



def test_accumulate_onto_fresh_psum_starts_the_group(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def mm(a, b):  # a [K, M], b [K, N]; K in two 128-row tiles
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            acc += nisa.nc_matmul(nl.load(a[k * 128:(k + 1) * 128, :]), nl.load(b[k * 128:(k + 1) * 128, :]))
        nl.store(out, value=nisa.tensor_copy(acc))
        return out

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((256, 128), dtype=np.float32), rng.standard_normal((256, 512), dtype=np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(mm, a, b), a.T @ b, rtol=1e-4, atol=1e-3)


def test_psum_block_dims_live_one_block_at_a_time(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def blocks(a, b):  # 16 blocks of [128, 512] FP32: 32 KiB per partition, twice PSUM
        out = nl.ndarray((16, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((16, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        for i in nl.affine_range(16):
            ps[i] = nisa.nc_matmul(nl.load(a[:, i * 128:(i + 1) * 128]), nl.load(b))
            nl.store(out[i], value=nisa.tensor_copy(ps[i]))
        return out

    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((128, 2048), dtype=np.float32), rng.standard_normal((128, 512), dtype=np.float32)
    want = np.stack([a[:, i * 128:(i + 1) * 128].T @ b for i in range(16)])
    np.testing.assert_allclose(nki.simulate_kernel(blocks, a, b), want, rtol=1e-4, atol=1e-3)


def test_copy_predicated_takes_a_bool_predicate(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def pick(pred, a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        dst = nl.load(b)
        nisa.tensor_copy_predicated(src=nl.load(a), dst=dst, predicate=nl.load(pred))
        nl.store(out, value=dst)
        return out

    rng = np.random.default_rng(5)
    a, b = rng.random((128, 64), dtype=np.float32), rng.random((128, 64), dtype=np.float32)
    pred = a <= 0.5
    np.testing.assert_array_equal(nki.simulate_kernel(pick, pred, a, b), np.where(pred, a, b))


def test_nl_max_as_an_instruction_op(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def running_max(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.tensor_tensor(nl.load(a), nl.load(b), op=nl.max))
        return out

    rng = np.random.default_rng(6)
    a, b = rng.random((128, 64), dtype=np.float32), rng.random((128, 64), dtype=np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(running_max, a, b), np.maximum(a, b))


def test_nl_max_as_the_op_of_a_dst_first_call(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def cummax(a, imm):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        dst = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(src=nl.load(a), dst=dst, op0=nl.add, op1=nl.max, imm0=nl.load(imm))
        nl.store(out, value=dst)
        return out

    rng = np.random.default_rng(7)
    a, imm = rng.standard_normal((128, 64), dtype=np.float32), rng.standard_normal((128, 1), dtype=np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(cummax, a, imm), np.maximum.accumulate(a + imm, axis=-1),
                               rtol=1e-6)
