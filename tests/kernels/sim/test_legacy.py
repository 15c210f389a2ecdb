"""The pre-0.6 NKI front end (``neuronxcc.nki``) over the simulator: small kernels in that
API, each against NumPy, and an out-of-bounds load refused naming its instruction."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.sim import shim
from trnopt.kernels.sim.errors import ConstraintError


def test_tiled_add_with_masks(legacy):
    nki, nl, _ = legacy

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        rows, cols = a.shape
        i_f = nl.arange(cols)[None, :]
        for t in nl.affine_range((rows + 127) // 128):
            i_p = t * 128 + nl.arange(128)[:, None]
            x = nl.load(a[i_p, i_f], mask=(i_p < rows))
            y = nl.load(b[i_p, i_f], mask=(i_p < rows))
            nl.store(out[i_p, i_f], value=x + y * 2.0, mask=(i_p < rows))
        return out

    rng = np.random.default_rng(1)
    a, b = rng.random((300, 64), dtype=np.float32), rng.random((300, 64), dtype=np.float32)
    got = nki.simulate_kernel(add, a, b)
    np.testing.assert_allclose(got, a + 2 * b, rtol=1e-6, atol=1e-6)


def test_nc_matmul_returns_a_psum_tile(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def mm(lhs_t, rhs):
        out = nl.ndarray((lhs_t.shape[1], rhs.shape[1]), dtype=np.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((lhs_t.shape[1], rhs.shape[1]), dtype=np.float32, buffer=nl.psum)
        for k in nl.affine_range(lhs_t.shape[0] // 128):
            a = nl.load(lhs_t[k * 128:(k + 1) * 128, :])
            b = nl.load(rhs[k * 128:(k + 1) * 128, :])
            r = nisa.nc_matmul(a, b)
            assert r.buffer is nl.psum and r.shape == (lhs_t.shape[1], rhs.shape[1])
            acc += r
        nl.store(out, value=acc)
        return out

    rng = np.random.default_rng(2)
    lhs_t, rhs = rng.standard_normal((256, 64), dtype=np.float32), rng.standard_normal((256, 128), dtype=np.float32)
    got = mm(lhs_t, rhs)
    np.testing.assert_allclose(got, lhs_t.T @ rhs, rtol=1e-4, atol=1e-4)


def test_mgrid_and_arange_indexing(legacy):
    nki, nl, _ = legacy

    @nki.jit
    def odd_even(x):
        p, f = x.shape
        even = nl.ndarray((p, f // 2), dtype=x.dtype, buffer=nl.shared_hbm)
        odd = nl.ndarray((p, f // 2), dtype=x.dtype, buffer=nl.shared_hbm)
        g = nl.mgrid[0:p, 0:f // 2]
        nl.store(even[g.p, g.x], value=nl.load(x[g.p, 2 * g.x]))
        i_p, i_f = nl.arange(p)[:, None], nl.arange(f // 2)[None, :]
        nl.store(odd[i_p, i_f], value=nl.load(x[i_p, 2 * i_f + 1]))
        return even, odd

    x = np.arange(16 * 10, dtype=np.float32).reshape(16, 10)
    even, odd = odd_even(x)
    np.testing.assert_array_equal(even, x[:, 0::2])
    np.testing.assert_array_equal(odd, x[:, 1::2])


def test_par_dim_block_tiles(legacy):
    nki, nl, nisa = legacy

    @nki.jit
    def scale_blocks(x):
        nb, f = x.shape[0] // 128, x.shape[1]
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray((nb, nl.par_dim(128), f), dtype=x.dtype, buffer=nl.sbuf)
        for i in nl.affine_range(nb):
            buf[i] = nl.load(x[i * 128:(i + 1) * 128, :])
        for i in nl.affine_range(nb):
            y = nisa.tensor_scalar(buf[i], np.multiply, float(i + 1))
            nl.store(out[i * 128:(i + 1) * 128, :], value=y)
        return out

    x = np.random.default_rng(3).random((384, 32), dtype=np.float32)
    want = x * np.repeat(np.arange(1, 4, dtype=np.float32), 128)[:, None]
    np.testing.assert_allclose(scale_blocks(x), want, rtol=1e-6)


def test_reduction_broadcasts_along_the_partition_dim(legacy):
    nki, nl, _ = legacy

    @nki.jit
    def center(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, value=t - nl.mean(t, axis=1))  # [128] is [128, 1] against [128, 64]
        return out

    x = np.random.default_rng(4).random((128, 64), dtype=np.float32)
    np.testing.assert_allclose(center(x), x - x.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_out_of_bounds_load_names_the_instruction(legacy):
    nki, nl, _ = legacy

    @nki.jit
    def bad(x):
        out = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p = 64 + nl.arange(128)[:, None]
        i_f = nl.arange(8)[None, :]
        nl.store(out, value=nl.load(x[i_p, i_f]))
        return out

    with pytest.raises(ConstraintError, match=r"nl\.load.*out of bounds for dim 0 of size 128"):
        bad(np.zeros((128, 8), np.float32))


def test_uninstall_restores_plain_tensors(legacy):
    from trnopt.kernels.sim.tensor import NkiTensor
    assert hasattr(NkiTensor, "__add__")
    shim.uninstall_legacy()
    assert "__add__" not in NkiTensor.__dict__
    shim.install_legacy()  # the fixture uninstalls again
